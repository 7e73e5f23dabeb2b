#include "L3/transformer_block.h"

namespace kbn::KBN_VARIANT {

TransformerBlock::TransformerBlock(const GptOssConfig& c, int64_t layer_index, const std::string& prefix,
                                   const ParamOptions& opts)
    : self_attn(c, layer_index, prefix + ".self_attn", opts),
      mlp(c, prefix + ".mlp", opts),
      input_layernorm(c.hidden_size, c.rms_norm_eps, opts),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, opts) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> TransformerBlock::forward(const Tensor& positions, const Tensor& hidden_states,
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
