#include "L3/qwen3_decoder_layer.h"

namespace kbn::KBN_VARIANT {

Qwen3DecoderLayer::Qwen3DecoderLayer(const Qwen3Config& config, const std::string& prefix, const ParamOptions& opts)
    : self_attn(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                config.max_position_embeddings, config.head_dim, config.rms_norm_eps, config.attention_bias,
                config.rope_theta, config.rope_scaling, prefix + ".self_attn", opts),
      mlp(config.hidden_size, config.intermediate_size, config.hidden_act, false, prefix + ".mlp", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> Qwen3DecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                     const Tensor& residual) {
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
