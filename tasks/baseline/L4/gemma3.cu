#include "L4/gemma3.h"

#include <cmath>

#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

Gemma3Model::Gemma3Model(const Gemma3TextConfig& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts),
      normalizer_(std::sqrt(double(config.hidden_size))) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(
        std::make_unique<Gemma3DecoderLayer>(config, i, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

Tensor Gemma3Model::forward(const Tensor& input_ids, const Tensor& positions) {
  Tensor h = embed_tokens.forward(input_ids, normalizer_), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(positions, h, residual);
  std::tie(h, residual) = norm.forward(h, residual);
  return h;
}

Gemma3ForCausalLM::Gemma3ForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(Gemma3TextConfig::from(config)),
      dtype_(opts.dtype),
      model(config_, "model", opts),
      lm_head(config_.vocab_size, config_.hidden_size, false, opts, "lm_head") {
  register_module("model", &model);
  if (config_.tie_word_embeddings) {
    lm_head.tie_weights(model.embed_tokens);
  } else {
    register_module("lm_head", &lm_head);
  }
}

Tensor Gemma3ForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  return model.forward(input_ids, positions);
}

Tensor Gemma3ForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> Gemma3ForCausalLM::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& layer : model.layers) specs.push_back(layer->self_attn.attn.cache_spec(dtype_));
  return specs;
}

void Gemma3ForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  load_stacked_weights(
      *this, weights, qkv_gate_up_stacking(),
      [tied](const std::string& name) {
        return name.find("rotary_emb.inv_freq") != std::string::npos || (tied && name == "lm_head.weight");
      },
      "Gemma3ForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
