#include "L4/mamba2.h"

#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

Mamba2Model::Mamba2Model(const Mamba2Config& config, const std::string& prefix, const ParamOptions& opts)
    : embeddings(config.vocab_size, config.hidden_size, opts, prefix + ".embeddings"),
      norm_f(config.hidden_size, config.layer_norm_epsilon, opts) {
  register_module("embeddings", &embeddings);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<Mamba2DecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm_f", &norm_f);
}

Tensor Mamba2Model::forward(const Tensor& input_ids) {
  Tensor h = embeddings.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(h, residual);
  std::tie(h, residual) = norm_f.forward(h, residual);
  return h;
}

Mamba2ForCausalLM::Mamba2ForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(Mamba2Config::from(config)),
      dtype_(opts.dtype),
      backbone(config_, "backbone", opts),
      lm_head(config_.vocab_size, config_.hidden_size, false, opts, "lm_head") {
  register_module("backbone", &backbone);
  if (config_.tie_word_embeddings) {
    lm_head.tie_weights(backbone.embeddings);
  } else {
    register_module("lm_head", &lm_head);
  }
}

Tensor Mamba2ForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  (void)positions;
  return backbone.forward(input_ids);
}

Tensor Mamba2ForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> Mamba2ForCausalLM::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& layer : backbone.layers) specs.push_back(layer->mixer.cache_spec(dtype_));
  return specs;
}

void Mamba2ForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  load_stacked_weights(
      *this, weights, {}, [tied](const std::string& name) { return tied && name == "lm_head.weight"; },
      "Mamba2ForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
