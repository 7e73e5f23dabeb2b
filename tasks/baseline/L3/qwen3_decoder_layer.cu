#include "L3/qwen3_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or one of this layer's L2 blocks, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_llama_mlp_h) ||                     \
    defined(KBN_CANDIDATE_REPLACES_L2_llama_mlp_cu) || defined(KBN_CANDIDATE_REPLACES_L2_qwen3_attention_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_qwen3_attention_cu)
#define KBN_QWEN3_ONE_TOKEN_FUSION 0
#else
#define KBN_QWEN3_ONE_TOKEN_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

Qwen3DecoderLayer::Qwen3DecoderLayer(const Qwen3Config& config, const std::string& prefix, const ParamOptions& opts)
    : self_attn(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                config.max_position_embeddings, config.head_dim, config.rms_norm_eps, config.attention_bias,
                config.rope_theta, config.rope_scaling, prefix + ".self_attn", opts),
      mlp(config.hidden_size, config.intermediate_size, config.hidden_act, false, prefix + ".mlp", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      norm_qkv_(config.rms_norm_eps),
      norm_gate_up_(config.rms_norm_eps, 0.0, NormGemvAct::silu_and_mul) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> Qwen3DecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                     const Tensor& residual) {
#if KBN_QWEN3_ONE_TOKEN_FUSION
  // One token: the norms folded into the projections after them (rms_norm_gemv; the same bits).
  if (RMSNormGemv::applies(hidden_states)) {
    auto [qkv, res] = norm_qkv_.forward(hidden_states, residual, input_layernorm.weight, self_attn.qkv_proj.weight,
                                        self_attn.qkv_proj.bias);
    if (!residual.defined()) res = hidden_states;
    const Tensor attn = self_attn.forward_qkv(positions, qkv);
    auto [act, res_mlp] = norm_gate_up_.forward(attn, res, post_attention_layernorm.weight, mlp.gate_up_proj.weight,
                                                mlp.gate_up_proj.bias);
    return {mlp.forward_act(act), res_mlp};
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
