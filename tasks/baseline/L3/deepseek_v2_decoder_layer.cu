#include "L3/deepseek_v2_decoder_layer.h"

#include "kbn/forward_context.h"

namespace kbn::KBN_VARIANT {

DeepseekV2DecoderLayer::DeepseekV2DecoderLayer(const DeepseekV2Config& config, const std::string& prefix,
                                               const ParamOptions& opts)
    : self_attn(config, prefix + ".self_attn", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      layer_idx_(extract_layer_index(prefix)) {
  register_module("self_attn", &self_attn);
  if (config.is_moe_layer(layer_idx_)) {
    moe = std::make_unique<DeepseekV2MoE>(config, prefix + ".mlp", opts);
    register_module("mlp", moe.get());
  } else {
    dense_mlp =
        std::make_unique<LlamaMLP>(config.hidden_size, config.intermediate_size, "silu", false, prefix + ".mlp", opts);
    register_module("mlp", dense_mlp.get());
  }
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> DeepseekV2DecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
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
  h = moe ? moe->forward(h) : dense_mlp->forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
