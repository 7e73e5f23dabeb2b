#include "L3/gemma3_decoder_layer.h"

namespace kbn::KBN_VARIANT {

Gemma3DecoderLayer::Gemma3DecoderLayer(const Gemma3TextConfig& config, int64_t layer_index, const std::string& prefix,
                                       const ParamOptions& opts)
    : self_attn(config, layer_index, prefix + ".self_attn", opts),
      mlp(config.hidden_size, config.intermediate_size, "gelu_pytorch_tanh", prefix + ".mlp", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      pre_feedforward_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_feedforward_layernorm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  register_module("pre_feedforward_layernorm", &pre_feedforward_layernorm);
  register_module("post_feedforward_layernorm", &post_feedforward_layernorm);
}

std::pair<Tensor, Tensor> Gemma3DecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                      const Tensor& residual) {
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
