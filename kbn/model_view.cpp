#include "kbn/model_view.h"

#include <algorithm>
#include <cmath>

#include "kbn/error.h"

namespace kbn {

bool ModelView::has_feature(std::string_view f) const {
  return std::find(features.begin(), features.end(), f) != features.end();
}

ModelView ModelView::from(const std::string& name, std::shared_ptr<const ModelConfig> config, int64_t tp) {
  KBN_CHECK(config != nullptr, "ModelView: no config for model '", name, "'");
  KBN_CHECK(tp >= 1, "--tp: expected a positive tensor-parallel size, got ", tp);
  const ModelConfig& c = *config;
  auto positive = [&](const char* key) {
    const int64_t v = c.get_int(key);
    KBN_CHECK(v > 0, "config ", c.source(), ": key '", key, "' must be positive, got ", v);
    return v;
  };
  auto split = [&](int64_t total, const char* key) {
    KBN_CHECK(total % tp == 0, "--tp: ", tp, " does not divide ", key, " = ", total, " (", c.source(), ")");
    return total / tp;
  };
  ModelView m;
  m.name = name;
  m.config = config;
  m.tp = tp;
  const auto archs = c.architectures();
  m.architecture = archs.empty() ? "" : archs.front();
  m.hidden_size = positive("hidden_size");
  m.total_vocab_size = positive("vocab_size");
  // NOTE: vLLM pads the vocabulary to a multiple of 64 before splitting; the real vocabularies already are.
  m.vocab_size = (m.total_vocab_size + tp - 1) / tp;
  m.num_layers = positive("num_hidden_layers");
  m.max_position_embeddings = c.get_int("max_position_embeddings", 8192);
  KBN_CHECK(m.max_position_embeddings > 0, "config ", c.source(),
            ": key 'max_position_embeddings' must be positive, got ", m.max_position_embeddings);
  m.rms_norm_eps = c.get_double("rms_norm_eps", c.get_double("layer_norm_epsilon", 1e-6));
  KBN_CHECK(m.rms_norm_eps > 0, "config ", c.source(), ": key 'rms_norm_eps' must be positive, got ", m.rms_norm_eps);
  // Mixture of experts: Mixtral names its expert count num_local_experts and its expert size intermediate_size
  // (it has no dense MLP); Qwen3-MoE names them num_experts and moe_intermediate_size, and keeps intermediate_size
  // for the dense layers that mlp_only_layers and decoder_sparse_step select; DeepSeek names them n_routed_experts
  // and moe_intermediate_size, its first first_k_dense_replace layers dense, then every moe_layer_freq-th sparse.
  const char* experts_key = c.has("num_local_experts")  ? "num_local_experts"
                            : c.has("n_routed_experts") ? "n_routed_experts"
                                                        : "num_experts";
  const bool moe = c.has(experts_key) && c.get_int(experts_key) > 0;
  int64_t dense_layers = m.num_layers;
  if (moe) {
    MoeShape e;
    e.num_experts = positive(experts_key);
    e.top_k = positive("num_experts_per_tok");
    KBN_CHECK(e.top_k <= e.num_experts, "config ", c.source(), ": 'num_experts_per_tok' (", e.top_k,
              ") must not exceed '", experts_key, "' (", e.num_experts, ")");
    const char* size_key = c.has("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size";
    e.total_intermediate_size = positive(size_key);
    e.intermediate_size = split(e.total_intermediate_size, size_key);
    e.renormalize = c.get_bool("norm_topk_prob", true);
    e.grouped_router = c.has("n_group") || c.has("topk_method");
    if (e.grouped_router) {
      const std::string scoring = c.get_string("scoring_func", "softmax");
      KBN_CHECK(scoring == "softmax" || scoring == "sigmoid", "config ", c.source(),
                ": key 'scoring_func' must be softmax or sigmoid, got '", scoring, "'");
      e.sigmoid_scores = scoring == "sigmoid";
      e.num_expert_group = c.get_int("n_group", 1);
      e.topk_group = c.get_int("topk_group", 1);
      KBN_CHECK(e.num_expert_group > 0 && e.num_experts % e.num_expert_group == 0, "config ", c.source(),
                ": key 'n_group' (", e.num_expert_group, ") must divide the experts (", e.num_experts, ")");
      KBN_CHECK(e.topk_group > 0 && e.topk_group <= e.num_expert_group, "config ", c.source(), ": key 'topk_group' (",
                e.topk_group, ") must be in [1, n_group = ", e.num_expert_group, "]");
      e.score_correction_bias = c.get_string("topk_method", "greedy") == "noaux_tc";
      e.routed_scaling_factor = c.get_double("routed_scaling_factor", 1.0);
    }
    // gpt-oss's experts (HF GptOssConfig, the one config with 'swiglu_limit'): swigluoai with biases.
    if (c.has("swiglu_limit")) {
      e.swigluoai = e.expert_bias = true;
      e.swiglu_limit = c.get_double("swiglu_limit");
      e.swiglu_alpha = c.get_double("swiglu_alpha", 1.702);
      KBN_CHECK(e.swiglu_limit > 0, "config ", c.source(), ": key 'swiglu_limit' must be positive, got ",
                e.swiglu_limit);
    }
    if (c.has("n_shared_experts") && c.get_int("n_shared_experts") > 0)
      e.shared_intermediate_size = split(c.get_int("n_shared_experts") * e.total_intermediate_size, "n_shared_experts");
    if (c.has("first_k_dense_replace")) {
      const int64_t first = c.get_int("first_k_dense_replace"),
                    freq = c.has("moe_layer_freq") ? positive("moe_layer_freq") : 1;
      KBN_CHECK(first >= 0, "config ", c.source(), ": key 'first_k_dense_replace' must not be negative, got ", first);
      for (int64_t l = first; l < m.num_layers; ++l)
        if (l % freq == 0) ++e.num_sparse_layers;
    } else {
      const int64_t step = c.has("decoder_sparse_step") ? positive("decoder_sparse_step") : 1;
      std::vector<int64_t> mlp_only;
      if (c.has("mlp_only_layers")) mlp_only = c.get_int_list("mlp_only_layers");
      for (int64_t l = 0; l < m.num_layers; ++l)
        if (std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && (l + 1) % step == 0)
          ++e.num_sparse_layers;
    }
    dense_layers = m.num_layers - e.num_sparse_layers;
    m.moe = e;
  }
  const bool mamba = c.has("state_size") && c.has("conv_kernel");
  if (mamba) {
    MambaShape s;
    s.total_num_heads = positive("num_heads");
    s.head_dim = positive("head_dim");
    s.state_size = positive("state_size");
    s.total_n_groups = c.get_int("n_groups", 1);
    s.conv_kernel = positive("conv_kernel");
    s.chunk_size = positive("chunk_size");
    s.conv_bias = c.get_bool("use_conv_bias", true);
    KBN_CHECK(s.total_n_groups > 0 && s.total_num_heads % s.total_n_groups == 0, "config ", c.source(),
              ": 'num_heads' (", s.total_num_heads, ") must be a multiple of 'n_groups' (", s.total_n_groups, ")");
    if (c.has("intermediate_size"))
      KBN_CHECK(c.get_int("intermediate_size") == s.total_num_heads * s.head_dim, "config ", c.source(),
                ": 'intermediate_size' (", c.get_int("intermediate_size"), ") must equal num_heads * head_dim (",
                s.total_num_heads * s.head_dim, ")");
    s.num_heads = split(s.total_num_heads, "num_heads");
    s.n_groups = s.total_n_groups == 1 ? 1 : split(s.total_n_groups, "n_groups");
    s.intermediate_size = s.num_heads * s.head_dim;
    m.mamba = s;
  }
  const bool dense_size = !mamba && (!moe || c.has("moe_intermediate_size"));
  if (dense_size && dense_layers > 0 && c.has("intermediate_size"))
    m.intermediate_size = split(positive("intermediate_size"), "intermediate_size");
  if (c.has("kv_lora_rank")) {
    MlaShape a;
    a.total_num_heads = positive("num_attention_heads");
    a.num_heads = split(a.total_num_heads, "num_attention_heads");
    a.q_lora_rank = c.get_int("q_lora_rank", 0);
    KBN_CHECK(a.q_lora_rank >= 0, "config ", c.source(), ": key 'q_lora_rank' must not be negative, got ",
              a.q_lora_rank);
    a.kv_lora_rank = positive("kv_lora_rank");
    a.qk_nope_head_dim = positive("qk_nope_head_dim");
    a.qk_rope_head_dim = positive("qk_rope_head_dim");
    a.v_head_dim = positive("v_head_dim");
    a.rope = parse_rope_config(c, 10000.0);
    a.softmax_scale = 1.0 / std::sqrt(double(a.qk_head_dim()));
    if (a.rope.scaling.rope_type == "yarn") {
      const double ms = yarn_mscale(a.rope.scaling.factor, a.rope.scaling.mscale_all_dim);
      a.softmax_scale *= ms * ms;
    }
    m.mla = a;
  } else if (c.has("num_attention_heads")) {
    AttentionShape a;
    a.total_num_heads = positive("num_attention_heads");
    a.total_num_kv_heads = c.get_int("num_key_value_heads", a.total_num_heads);
    KBN_CHECK(a.total_num_kv_heads > 0 && a.total_num_heads % a.total_num_kv_heads == 0, "config ", c.source(),
              ": 'num_attention_heads' (", a.total_num_heads, ") must be a multiple of 'num_key_value_heads' (",
              a.total_num_kv_heads, ")");
    a.head_dim = c.get_int("head_dim", 0);
    if (a.head_dim == 0) {
      KBN_CHECK(m.hidden_size % a.total_num_heads == 0, "config ", c.source(), ": 'hidden_size' (", m.hidden_size,
                ") must be a multiple of 'num_attention_heads' (", a.total_num_heads, ") when 'head_dim' is absent");
      a.head_dim = m.hidden_size / a.total_num_heads;
    }
    KBN_CHECK(a.head_dim > 0, "config ", c.source(), ": key 'head_dim' must be positive, got ", a.head_dim);
    a.num_heads = split(a.total_num_heads, "num_attention_heads");
    // NOTE: like vLLM's QKVParallelLinear, fewer kv heads than ranks means each rank holds one replicated head.
    KBN_CHECK(a.total_num_kv_heads % tp == 0 || tp % a.total_num_kv_heads == 0, "--tp: ", tp,
              " must divide num_key_value_heads = ", a.total_num_kv_heads, " or be a multiple of it (", c.source(),
              ")");
    a.num_kv_heads = std::max<int64_t>(1, a.total_num_kv_heads / tp);
    a.rope = parse_rope_config(c, 10000.0);
    if (c.has("sliding_window") && c.get_bool("use_sliding_window", true)) {
      a.sliding_window = c.get_int("sliding_window");
      KBN_CHECK(a.sliding_window > 0, "config ", c.source(), ": key 'sliding_window' must be positive (or null), got ",
                a.sliding_window);
      const std::vector<std::string> types = c.get_string_list("layer_types");
      if (!types.empty()) {
        a.num_sliding_layers = std::count(types.begin(), types.end(), std::string("sliding_attention"));
      } else if (c.has("sliding_window_pattern")) {
        const int64_t pattern = c.get_int("sliding_window_pattern");
        KBN_CHECK(pattern > 0, "config ", c.source(), ": key 'sliding_window_pattern' must be positive, got ", pattern);
        a.num_sliding_layers = m.num_layers - m.num_layers / pattern;
      } else {
        a.num_sliding_layers = m.num_layers;
      }
    }
    a.logits_soft_cap = c.get_double("attn_logit_softcapping", 0.0);
    KBN_CHECK(a.logits_soft_cap >= 0, "config ", c.source(),
              ": key 'attn_logit_softcapping' must be >= 0 (or null), got ", a.logits_soft_cap);
    m.attention = a;
  }
  return m;
}

}  // namespace kbn
