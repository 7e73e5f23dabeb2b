#include "L3/transformer_block.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or the attention block, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_gpt_oss_attention_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_gpt_oss_attention_cu)
#define KBN_GPT_OSS_ONE_TOKEN_FUSION 0
#else
#define KBN_GPT_OSS_ONE_TOKEN_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

TransformerBlock::TransformerBlock(const GptOssConfig& c, int64_t layer_index, const std::string& prefix,
                                   const ParamOptions& opts)
    : self_attn(c, layer_index, prefix + ".self_attn", opts),
      mlp(c, prefix + ".mlp", opts),
      input_layernorm(c.hidden_size, c.rms_norm_eps, opts),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, opts),
      norm_qkv_(c.rms_norm_eps) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> TransformerBlock::forward(const Tensor& positions, const Tensor& hidden_states,
                                                    const Tensor& residual) {
#if KBN_GPT_OSS_ONE_TOKEN_FUSION
  // One token: the input norm folded into qkv_proj (rms_norm_gemv; the same bits). The MoE block's router and experts
  // read the post-attention norm's output.
  if (RMSNormGemv::applies(hidden_states)) {
    auto [qkv, res] = norm_qkv_.forward(hidden_states, residual, input_layernorm.weight, self_attn.qkv_proj.weight,
                                        self_attn.qkv_proj.bias);
    if (!residual.defined()) res = hidden_states;
    Tensor h = self_attn.forward_qkv(positions, qkv);
    std::tie(h, res) = post_attention_layernorm.forward(h, res);
    return {mlp.forward(h), res};
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
  h = mlp.forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
