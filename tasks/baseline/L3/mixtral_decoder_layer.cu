#include "L3/mixtral_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or the attention block, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_llama_attention_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_llama_attention_cu)
#define KBN_MIXTRAL_ONE_TOKEN_FUSION 0
#else
#define KBN_MIXTRAL_ONE_TOKEN_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

MixtralDecoderLayer::MixtralDecoderLayer(const MixtralConfig& config, const std::string& prefix,
                                         const ParamOptions& opts)
    : self_attn(config, config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.rope_theta,
                config.rope_scaling, config.max_position_embeddings, config.attention_bias, prefix + ".self_attn",
                opts),
      block_sparse_moe(config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
                       config.intermediate_size, prefix + ".block_sparse_moe", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      norm_qkv_(config.rms_norm_eps) {
  register_module("self_attn", &self_attn);
  register_module("block_sparse_moe", &block_sparse_moe);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> MixtralDecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                       const Tensor& residual) {
#if KBN_MIXTRAL_ONE_TOKEN_FUSION
  // One token: the input norm folded into qkv_proj (rms_norm_gemv; the same bits). The MoE block's router and experts
  // read the post-attention norm's output.
  if (RMSNormGemv::applies(hidden_states)) {
    auto [qkv, res] = norm_qkv_.forward(hidden_states, residual, input_layernorm.weight, self_attn.qkv_proj.weight,
                                        self_attn.qkv_proj.bias);
    if (!residual.defined()) res = hidden_states;
    Tensor h = self_attn.forward_qkv(positions, qkv);
    std::tie(h, res) = post_attention_layernorm.forward(h, res);
    return {block_sparse_moe.forward(h), res};
  }
#endif
  Tensor h, res;
  if (!residual.defined()) {
    res = hidden_states;
    h = input_layernorm.forward(hidden_states);
  } else {
    std::tie(h, res) = input_layernorm.forward(hidden_states, residual);
  }
  h = self_attn.forward(positions, h);
  std::tie(h, res) = post_attention_layernorm.forward(h, res);
  h = block_sparse_moe.forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
