#pragma once
// MixtralDecoderLayer (vLLM mixtral.py): pre-norm attention and sparse-MoE blocks with the residual carried between
// layers (fused_add_rms_norm). vLLM's MixtralAttention is Llama's attention (qkv, neox rope, no q/k norm, no bias,
// head_dim from the config or hidden_size / heads), so this layer uses LlamaAttention; the MoE keeps HF's attribute
// name block_sparse_moe.
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/llama_attention.h"
#include "L2/mixtral_moe.h"
#include "configs/mixtral.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MixtralDecoderLayer : public Module {
 public:
  MixtralDecoderLayer(const MixtralConfig& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or
  // undefined for the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the
  // norms work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  LlamaAttention self_attn;
  MixtralMoE block_sparse_moe;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  RMSNormGemv norm_qkv_;  // the one-token path: the input norm + qkv_proj
};

}  // namespace kbn::KBN_VARIANT
