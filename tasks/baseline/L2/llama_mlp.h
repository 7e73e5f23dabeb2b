#pragma once
// LlamaMLP (vLLM llama.py): down_proj(silu(gate_proj(x)) * up_proj(x)), gate and up fused in one GEMM.
#include <string>

#include "L1/silu_and_mul.h"
#include "L2/parallel_linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class LlamaMLP : public Module {
 public:
  LlamaMLP(int64_t hidden_size, int64_t intermediate_size, const std::string& hidden_act, bool bias,
           const std::string& prefix, const ParamOptions& opts);

  // x: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& x);
  // The same after silu(gate) * up: act [num_tokens, intermediate_size / tp] -> [num_tokens, hidden_size] (the
  // decoder layers' one-token path computes act fused with the norm and gate_up_proj: rms_norm_gemv).
  Tensor forward_act(const Tensor& act);

  MergedColumnParallelLinear gate_up_proj;
  RowParallelLinear down_proj;
  SiluAndMul act_fn;
};

}  // namespace kbn::KBN_VARIANT
