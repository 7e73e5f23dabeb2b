#include "L3/qwen3_moe_decoder_layer.h"

namespace kbn::KBN_VARIANT {

namespace {

// The layer index a prefix ends in: "model.layers.12" -> 12 (vLLM extract_layer_index); the error names the prefix.
int64_t layer_index_of(const std::string& prefix) {
  const size_t dot = prefix.rfind('.');
  const std::string tail = dot == std::string::npos ? prefix : prefix.substr(dot + 1);
  KBN_CHECK(!tail.empty() && tail.size() < 10 && tail.find_first_not_of("0123456789") == std::string::npos,
            "Qwen3MoeDecoderLayer: prefix '", prefix, "' does not end in a layer index (\"model.layers.<i>\")");
  return std::stoll(tail);
}

}  // namespace

Qwen3MoeDecoderLayer::Qwen3MoeDecoderLayer(const Qwen3MoeConfig& config, const std::string& prefix,
                                           const ParamOptions& opts)
    : self_attn(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                config.max_position_embeddings, config.head_dim, config.rms_norm_eps, config.attention_bias,
                config.rope_theta, config.rope_scaling, prefix + ".self_attn", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      layer_idx_(layer_index_of(prefix)) {
  register_module("self_attn", &self_attn);
  if (config.is_sparse_layer(layer_idx_)) {
    sparse_mlp = std::make_unique<Qwen3MoeSparseMoeBlock>(config, prefix + ".mlp", opts);
    register_module("mlp", sparse_mlp.get());
  } else {
    dense_mlp = std::make_unique<LlamaMLP>(config.hidden_size, config.intermediate_size, config.hidden_act, false,
                                           prefix + ".mlp", opts);
    register_module("mlp", dense_mlp.get());
  }
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> Qwen3MoeDecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
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
  h = sparse_mlp ? sparse_mlp->forward(h) : dense_mlp->forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
