#pragma once
// Qwen3DecoderLayer (vLLM qwen3.py): pre-norm Qwen3Attention and MLP blocks with the residual carried between
// layers (fused_add_rms_norm). vLLM's MLP here is Qwen2MLP, the same block as LlamaMLP, which this layer uses.
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/llama_mlp.h"
#include "L2/qwen3_attention.h"
#include "configs/qwen3.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Qwen3DecoderLayer : public Module {
 public:
  Qwen3DecoderLayer(const Qwen3Config& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or
  // undefined for the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the
  // norms work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  Qwen3Attention self_attn;
  LlamaMLP mlp;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  RMSNormGemv norm_qkv_, norm_gate_up_;  // the one-token path: norm + qkv_proj, norm + gate_up_proj + silu*mul
};

}  // namespace kbn::KBN_VARIANT
