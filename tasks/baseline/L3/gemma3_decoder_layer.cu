#include "L3/gemma3_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test, the Gemma norm, gelu_and_mul) or one of this layer's L2 blocks, so a candidate is reached at every token
// count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L1_gemma_rms_norm_h) ||                     \
    defined(KBN_CANDIDATE_REPLACES_L1_gemma_rms_norm_cu) || defined(KBN_CANDIDATE_REPLACES_L1_gelu_and_mul_h) ||    \
    defined(KBN_CANDIDATE_REPLACES_L1_gelu_and_mul_cu) || defined(KBN_CANDIDATE_REPLACES_L2_gemma3_attention_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_gemma3_attention_cu) || defined(KBN_CANDIDATE_REPLACES_L2_gemma3_mlp_h) ||   \
    defined(KBN_CANDIDATE_REPLACES_L2_gemma3_mlp_cu)
#define KBN_GEMMA3_ONE_TOKEN_FUSION 0
#else
#define KBN_GEMMA3_ONE_TOKEN_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

Gemma3DecoderLayer::Gemma3DecoderLayer(const Gemma3TextConfig& config, int64_t layer_index, const std::string& prefix,
                                       const ParamOptions& opts)
    : self_attn(config, layer_index, prefix + ".self_attn", opts),
      mlp(config.hidden_size, config.intermediate_size, "gelu_pytorch_tanh", prefix + ".mlp", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      pre_feedforward_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_feedforward_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      norm_qkv_(config.rms_norm_eps, 1.0),
      norm_gate_up_(config.rms_norm_eps, 1.0, NormGemvAct::gelu_tanh_and_mul) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  register_module("pre_feedforward_layernorm", &pre_feedforward_layernorm);
  register_module("post_feedforward_layernorm", &post_feedforward_layernorm);
}

std::pair<Tensor, Tensor> Gemma3DecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                      const Tensor& residual) {
#if KBN_GEMMA3_ONE_TOKEN_FUSION
  // One token: the input norm folded into qkv_proj and the pre-feedforward norm into gate_up_proj and gelu_tanh*mul
  // (rms_norm_gemv with GemmaRMSNorm's 1 + w; the same bits). The post-attention and post-feedforward norms read a
  // projection's whole output and stay on their own.
  if (RMSNormGemv::applies(hidden_states)) {
    auto [qkv, res] = norm_qkv_.forward(hidden_states, residual, input_layernorm.weight, self_attn.qkv_proj.weight,
                                        self_attn.qkv_proj.bias);
    if (!residual.defined()) res = hidden_states;
    const Tensor attn = post_attention_layernorm.forward(self_attn.forward_qkv(positions, qkv));
    auto [act, res_mlp] = norm_gate_up_.forward(attn, res, pre_feedforward_layernorm.weight, mlp.gate_up_proj.weight,
                                                mlp.gate_up_proj.bias);
    return {post_feedforward_layernorm.forward(mlp.forward_act(act)), res_mlp};
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
  h = post_attention_layernorm.forward(h);
  std::tie(h, res) = pre_feedforward_layernorm.forward(h, res);
  h = mlp.forward(h);
  h = post_feedforward_layernorm.forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
