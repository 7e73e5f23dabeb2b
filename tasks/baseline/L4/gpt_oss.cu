#include "L4/gpt_oss.h"

#include "kbn/error.h"
#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

GptOssModel::GptOssModel(const GptOssConfig& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<TransformerBlock>(config, i, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

Tensor GptOssModel::forward(const Tensor& input_ids, const Tensor& positions) {
  Tensor h = embed_tokens.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(positions, h, residual);
  std::tie(h, residual) = norm.forward(h, residual);
  return h;
}

GptOssForCausalLM::GptOssForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(GptOssConfig::from(config)),
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

Tensor GptOssForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  return model.forward(input_ids, positions);
}

Tensor GptOssForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> GptOssForCausalLM::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& layer : model.layers) specs.push_back(layer->self_attn.attn.cache_spec(dtype_));
  return specs;
}

void GptOssForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  // The published checkpoints' MXFP4 experts would otherwise fail as unknown tensors with no word on why.
  const WeightSource renamed = [&](const WeightVisitor& visit) {
    weights([&](const std::string& name, const Tensor& tensor) {
      KBN_CHECK(!name.ends_with("_blocks") && !name.ends_with("_scales"), "GptOssForCausalLM::load_weights: '", name,
                "' is an MXFP4 expert tensor; kb-nano's gpt-oss reads bf16 experts (gate_up_proj, down_proj and "
                "their biases), not the quantized checkpoint");
      visit(FusedMoE::gpt_oss_expert_names(name), tensor);
    });
  };
  load_stacked_weights(
      *this, renamed, qkv_gate_up_stacking(),
      [tied](const std::string& name) {
        return name.find("rotary_emb.inv_freq") != std::string::npos || (tied && name == "lm_head.weight");
      },
      "GptOssForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
