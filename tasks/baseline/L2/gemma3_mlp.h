#pragma once
// Gemma3MLP (vLLM gemma3.py): down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)), gate and up fused in one GEMM.
#include <string>

#include "L1/gelu_and_mul.h"
#include "L2/parallel_linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Gemma3MLP : public Module {
 public:
  // hidden_activation: "gelu_pytorch_tanh" (the only one Gemma-3 uses; anything else is an error naming it).
  Gemma3MLP(int64_t hidden_size, int64_t intermediate_size, const std::string& hidden_activation,
            const std::string& prefix, const ParamOptions& opts);

  // x: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& x);
  // The same after gelu_tanh(gate) * up: act [num_tokens, intermediate_size / tp] -> [num_tokens, hidden_size]
  // (Gemma3DecoderLayer's one-token path computes act fused with the norm and gate_up_proj: rms_norm_gemv).
  Tensor forward_act(const Tensor& act);

  MergedColumnParallelLinear gate_up_proj;
  RowParallelLinear down_proj;
  GeluAndMul act_fn;
};

}  // namespace kbn::KBN_VARIANT
