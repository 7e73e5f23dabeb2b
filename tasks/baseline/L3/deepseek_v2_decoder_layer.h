#pragma once
// DeepseekV2DecoderLayer (vLLM deepseek_v2.py): input_layernorm -> multi-head latent attention ->
// post_attention_layernorm -> either DeepseekV2MoE (routed + shared experts) or, for the first
// first_k_dense_replace layers (and layers off moe_layer_freq), a dense MLP of intermediate_size (vLLM's
// DeepseekV2MLP is LlamaMLP's block), with the residual carried between layers (fused_add_rms_norm).
#include <memory>
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L2/deepseek_v2_mla_attention.h"
#include "L2/deepseek_v2_moe.h"
#include "L2/llama_mlp.h"
#include "configs/deepseek_v2.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class DeepseekV2DecoderLayer : public Module {
 public:
  // prefix must end in the layer index ("model.layers.3"), as vLLM's extract_layer_index requires.
  DeepseekV2DecoderLayer(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or undefined for
  // the first layer -> (hidden_states, residual). Mutates hidden_states and residual.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  int64_t layer_idx() const { return layer_idx_; }
  bool is_moe() const { return moe != nullptr; }

  DeepseekV2MLAAttention self_attn;
  // Exactly one of the two is set; it is registered as "mlp".
  std::unique_ptr<DeepseekV2MoE> moe;
  std::unique_ptr<LlamaMLP> dense_mlp;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  int64_t layer_idx_;
};

}  // namespace kbn::KBN_VARIANT
