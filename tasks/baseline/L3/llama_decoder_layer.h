#pragma once
// LlamaDecoderLayer (vLLM llama.py): pre-norm attention and MLP blocks with the residual carried between
// layers, so each norm fuses the previous residual add (fused_add_rms_norm). At one token (batch-1 decode) each norm
// also folds into the projection after it, and silu*mul into gate_up_proj's output (rms_norm_gemv: the same bits,
// three kernels fewer per layer).
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/llama_attention.h"
#include "L2/llama_mlp.h"
#include "configs/llama.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or
  // undefined for the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the
  // norms work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  LlamaAttention self_attn;
  LlamaMLP mlp;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  RMSNormGemv norm_qkv_, norm_gate_up_;
};

}  // namespace kbn::KBN_VARIANT
