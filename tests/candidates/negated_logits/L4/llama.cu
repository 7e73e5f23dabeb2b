// Test candidate, not a model: LlamaForCausalLM with negated logits, to show an L4 candidate replaces the
// model and nothing below it.
#include "L4/llama.h"

#include <map>
#include <set>

#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

LlamaModel::LlamaModel(const LlamaConfig& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<LlamaDecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

Tensor LlamaModel::forward(const Tensor& input_ids, const Tensor& positions) {
  Tensor h = embed_tokens.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(positions, h, residual);
  std::tie(h, residual) = norm.forward(h, residual);
  return h;
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(LlamaConfig::from(config)),
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

Tensor LlamaForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  return model.forward(input_ids, positions);
}

Tensor LlamaForCausalLM::compute_logits(const Tensor& hidden_states) {
  // The test's deliberate difference: negated logits, so greedy decoding picks the least likely token.
  Tensor logits = lm_head.forward(hidden_states);
  KBN_CHECK(logits.is_cpu(), "negated_logits test candidate: CPU only");
  std::vector<float> v = logits.to_floats();
  for (float& e : v) e = -e;
  return Tensor::from_floats(v, logits.shape(), logits.dtype());
}

std::vector<LayerCacheSpec> LlamaForCausalLM::cache_specs() const {
  const auto& attn = model.layers.front()->self_attn.qkv_proj;
  return std::vector<LayerCacheSpec>(size_t(config_.num_hidden_layers),
                                     LayerCacheSpec::paged_kv(attn.num_kv_heads(), config_.head_dim, dtype_));
}

void LlamaForCausalLM::load_weights(const WeightSource& weights) {
  // (fused parameter suffix, checkpoint suffix, shard id), as vLLM's stacked_params_mapping.
  static const struct {
    const char* param;
    const char* ckpt;
    const char* shard;
  } kStacked[] = {{".qkv_proj", ".q_proj", "q"},
                  {".qkv_proj", ".k_proj", "k"},
                  {".qkv_proj", ".v_proj", "v"},
                  {".gate_up_proj", ".gate_proj", "0"},
                  {".gate_up_proj", ".up_proj", "1"}};
  std::map<std::string, Parameter> params;
  for (auto& [name, p] : named_parameters()) params.emplace(name, p);
  // Every parameter must be filled; fused ones by each of their shards.
  std::map<std::string, std::set<std::string>> filled;

  weights([&](const std::string& ckpt_name, const Tensor& tensor) {
    if (ckpt_name.find("rotary_emb.inv_freq") != std::string::npos) return;    // recomputed, never loaded
    if (config_.tie_word_embeddings && ckpt_name == "lm_head.weight") return;  // same tensor as embed_tokens
    std::string name = ckpt_name, shard;
    for (const auto& s : kStacked) {
      size_t pos = name.find(s.ckpt);
      if (pos != std::string::npos) {
        name.replace(pos, std::string(s.ckpt).size(), s.param);
        shard = s.shard;
        break;
      }
    }
    auto it = params.find(name);
    KBN_CHECK(it != params.end(), "LlamaForCausalLM::load_weights: checkpoint tensor '", ckpt_name,
              "' matches no parameter (looked for '", name, "')");
    try {
      it->second.loader(*it->second.tensor, tensor, shard);
    } catch (const Error& e) {
      KBN_FAIL("LlamaForCausalLM::load_weights: '", ckpt_name, "': ", e.what());
    }
    KBN_CHECK(filled[name].insert(shard).second, "LlamaForCausalLM::load_weights: checkpoint tensor '", ckpt_name,
              "' appears twice");
  });

  for (auto& [name, p] : params) {
    size_t need = 1;
    if (name.find(".qkv_proj.") != std::string::npos) need = 3;
    if (name.find(".gate_up_proj.") != std::string::npos) need = 2;
    KBN_CHECK(filled[name].size() == need, "LlamaForCausalLM::load_weights: parameter '", name,
              "' was not filled by the checkpoint (", filled[name].size(), " of ", need, " parts found)");
  }
}

}  // namespace kbn::KBN_VARIANT
