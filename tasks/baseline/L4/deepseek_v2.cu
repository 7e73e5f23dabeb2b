#include "L4/deepseek_v2.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

DeepseekV2Model::DeepseekV2Model(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts)
    : embed_tokens(config.vocab_size, config.hidden_size, opts, prefix + ".embed_tokens"),
      norm(config.hidden_size, config.rms_norm_eps, opts) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<DeepseekV2DecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
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

namespace {

bool ends_with(const std::string& s, std::string_view x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// What the attention's and experts' checkpoint tensors say of the config's MLA and MoE fields, so that a config which
// disagrees with its checkpoint is named by field and value (the loader alone names a parameter's shape, and the first
// tensor to disagree, kv_a_layernorm or kv_a_proj_with_mqa, depends on several fields).
struct LatentShapeCheck {
  const DeepseekV2Config& c;
  int64_t rank = -1, latent = -1, q_rows = -1, kv_b_rows = -1, o_cols = -1;
  int64_t expert_rows = -1;  // an expert's intermediate size
  int64_t expert = -1;       // the largest expert index past n_routed_experts seen
  std::string first;         // the first tensor that disagreed, as "'name' is f32[...]"

  // Records `t` when it tells a field; true when it disagrees with the config.
  bool observe(const std::string& name, const Tensor& t) {
    bool bad = false;
    const auto note = [&](int64_t& slot, int64_t value, int64_t expected) {
      if (slot < 0) slot = value;
      bad = bad || value != expected;
    };
    const int64_t N = c.num_heads;
    if (name.find(".self_attn.") != std::string::npos) {
      if (ends_with(name, ".kv_a_layernorm.weight") && t.dim() == 1) note(rank, t.size(0), c.kv_lora_rank);
      if (ends_with(name, ".kv_a_proj_with_mqa.weight") && t.dim() == 2) note(latent, t.size(0), c.latent_size());
      if (ends_with(name, ".q_proj.weight") && t.dim() == 2) note(q_rows, t.size(0), N * c.qk_head_dim());
      if (ends_with(name, ".q_b_proj.weight") && t.dim() == 2) note(q_rows, t.size(0), N * c.qk_head_dim());
      if (ends_with(name, ".kv_b_proj.weight") && t.dim() == 2) {
        note(kv_b_rows, t.size(0), N * (c.qk_nope_head_dim + c.v_head_dim));
        note(rank, t.size(1), c.kv_lora_rank);
      }
      if (ends_with(name, ".o_proj.weight") && t.dim() == 2) note(o_cols, t.size(1), N * c.v_head_dim);
    } else if (const size_t at = name.find(".mlp.experts."); at != std::string::npos) {
      const size_t begin = at + 13, end = name.find('.', begin);
      const std::string index = name.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 10) {
        const int64_t e = std::stoll(index);
        if (e >= c.n_routed_experts) {
          expert = std::max(expert, e);
          bad = true;
        }
        if ((ends_with(name, ".gate_proj.weight") || ends_with(name, ".up_proj.weight")) && t.dim() == 2)
          note(expert_rows, t.size(0), c.moe_intermediate_size);
        if (ends_with(name, ".down_proj.weight") && t.dim() == 2) note(expert_rows, t.size(1), c.moe_intermediate_size);
      }
    }
    if (bad && first.empty()) first = "'" + name + "' is " + t.str();
    return bad;
  }
  bool complete() const { return rank >= 0 && latent >= 0 && q_rows >= 0 && kv_b_rows >= 0 && o_cols >= 0; }

  // The field to blame, from what was seen; throws.
  [[noreturn]] void fail() const {
    const std::string pre = "DeepseekV2ForCausalLM: the config disagrees with its checkpoint (" + first + "): ";
    const int64_t N = c.num_heads;
    if (rank >= 0 && rank != c.kv_lora_rank)
      KBN_FAIL(pre, "'kv_lora_rank' is ", c.kv_lora_rank, ", the checkpoint's latent kv_c is ", rank, " wide");
    if (latent >= 0 && latent != c.latent_size())
      KBN_FAIL(pre, "'kv_lora_rank' + 'qk_rope_head_dim' is ", c.kv_lora_rank, " + ", c.qk_rope_head_dim, " = ",
               c.latent_size(), ", the checkpoint's kv_a_proj_with_mqa gives ", latent,
               rank >= 0 ? " ('qk_rope_head_dim' " + std::to_string(latent - rank) + ")" : std::string());
    if (expert >= 0)
      KBN_FAIL(pre, "'n_routed_experts' is ", c.n_routed_experts, ", the checkpoint has expert ", expert,
               " (numbered from 0)");
    if (expert_rows >= 0 && expert_rows != c.moe_intermediate_size)
      KBN_FAIL(pre, "'moe_intermediate_size' is ", c.moe_intermediate_size, ", the checkpoint's experts have ",
               expert_rows);
    if (o_cols >= 0 && o_cols != N * c.v_head_dim)
      KBN_FAIL(pre, "'num_attention_heads' x 'v_head_dim' is ", N, " x ", c.v_head_dim, " = ", N * c.v_head_dim,
               ", the checkpoint's o_proj reads ", o_cols);
    if (q_rows >= 0 && q_rows != N * c.qk_head_dim())
      KBN_FAIL(pre, "'num_attention_heads' x ('qk_nope_head_dim' + 'qk_rope_head_dim') is ", N, " x ", c.qk_head_dim(),
               " = ", N * c.qk_head_dim(), ", the checkpoint's query has ", q_rows);
    KBN_FAIL(pre, "'num_attention_heads' x ('qk_nope_head_dim' + 'v_head_dim') is ", N, " x ",
             c.qk_nope_head_dim + c.v_head_dim, " = ", N * (c.qk_nope_head_dim + c.v_head_dim),
             ", the checkpoint's kv_b_proj has ", kv_b_rows, " rows");
  }
};

}  // namespace

void DeepseekV2ForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  const int64_t layers = config_.num_hidden_layers;
  // MLA keeps q_proj (or q_a/q_b) separate: only the MLPs' gate and up fuse.
  static const std::vector<StackedParam> gate_up = {{".gate_up_proj", ".gate_proj", "0"},
                                                    {".gate_up_proj", ".up_proj", "1"}};
  LatentShapeCheck check{config_};
  bool disagrees = false;
  // Once a tensor disagrees, nothing more is loaded: the tensors that follow only complete the picture (the first
  // layer's attention pins every field), then the error names the field.
  const WeightSource checked = [&](const WeightVisitor& visit) {
    weights([&](const std::string& name, const Tensor& t) {
      disagrees = check.observe(name, t) || disagrees;
      if (disagrees && check.complete()) check.fail();
      if (!disagrees) visit(name, t);
    });
    if (disagrees) check.fail();
  };
  load_stacked_weights(
      *this, checked, gate_up,
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
