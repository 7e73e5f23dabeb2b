#include "L4/deepseek_v2.h"

#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

DeepseekV2Model::DeepseekV2Model(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(
        std::make_unique<DeepseekV2DecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

Tensor DeepseekV2Model::forward(const Tensor& input_ids, const Tensor& positions) {
  Tensor h = embed_tokens.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(positions, h, residual);
  std::tie(h, residual) = norm.forward(h, residual);
  return h;
}

DeepseekV2ForCausalLM::DeepseekV2ForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(DeepseekV2Config::from(config)),
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

Tensor DeepseekV2ForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  return model.forward(input_ids, positions);
}

Tensor DeepseekV2ForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> DeepseekV2ForCausalLM::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& layer : model.layers) specs.push_back(layer->self_attn.cache_spec(dtype_));
  return specs;
}

void DeepseekV2ForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  const int64_t layers = config_.num_hidden_layers;
  // MLA keeps q_proj (or q_a/q_b) separate: only the MLPs' gate and up fuse.
  static const std::vector<StackedParam> gate_up = {{".gate_up_proj", ".gate_proj", "0"},
                                                    {".gate_up_proj", ".up_proj", "1"}};
  load_stacked_weights(
      *this, weights, gate_up,
      FusedMoE::make_expert_params_mapping("gate_proj", "down_proj", "up_proj", config_.n_routed_experts),
      [tied, layers](const std::string& name) {
        if (name.find("rotary_emb.inv_freq") != std::string::npos || (tied && name == "lm_head.weight")) return true;
        // V3's multi-token-prediction module is stored as layer num_hidden_layers (and up).
        const std::string p = "model.layers.";
        if (name.rfind(p, 0) != 0) return false;
        const size_t end = name.find('.', p.size());
        return end != std::string::npos && std::stoll(name.substr(p.size(), end - p.size())) >= layers;
      },
      "DeepseekV2ForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
