#include "L4/mixtral.h"

#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

MixtralModel::MixtralModel(const MixtralConfig& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<MixtralDecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

Tensor MixtralModel::forward(const Tensor& input_ids, const Tensor& positions) {
  Tensor h = embed_tokens.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(positions, h, residual);
  std::tie(h, residual) = norm.forward(h, residual);
  return h;
}

MixtralForCausalLM::MixtralForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(MixtralConfig::from(config)),
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

Tensor MixtralForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  return model.forward(input_ids, positions);
}

Tensor MixtralForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> MixtralForCausalLM::cache_specs() const {
  const auto& attn = model.layers.front()->self_attn.qkv_proj;
  return std::vector<LayerCacheSpec>(size_t(config_.num_hidden_layers),
                                     LayerCacheSpec::paged_kv(attn.num_kv_heads(), config_.head_dim, dtype_));
}

void MixtralForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  load_stacked_weights(
      *this, weights, qkv_gate_up_stacking(),
      FusedMoE::make_expert_params_mapping("w1", "w2", "w3", config_.num_local_experts),
      [tied](const std::string& name) {
        return name.find("rotary_emb.inv_freq") != std::string::npos || (tied && name == "lm_head.weight");
      },
      "MixtralForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
