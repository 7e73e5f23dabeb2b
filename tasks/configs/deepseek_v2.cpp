#include "configs/deepseek_v2.h"

#include <cmath>

#include "kbn/error.h"

namespace kbn {

bool DeepseekV2Config::is_moe_layer(int64_t layer_idx) const {
  KBN_CHECK(layer_idx >= 0 && layer_idx < num_hidden_layers, "DeepseekV2Config::is_moe_layer: layer_idx ", layer_idx,
            " is outside [0, num_hidden_layers = ", num_hidden_layers, ")");
  return n_routed_experts > 0 && layer_idx >= first_k_dense_replace && layer_idx % moe_layer_freq == 0;
}

double DeepseekV2Config::softmax_scale() const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope.scaling.rope_type == "yarn") {
    const double m = yarn_mscale(rope.scaling.factor, rope.scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

DeepseekV2Config DeepseekV2Config::from(const ModelConfig& c) {
  DeepseekV2Config d;
  const auto positive = [&](const char* key) {
    const int64_t v = c.get_int(key);
    KBN_CHECK(v > 0, "config ", c.source(), ": key '", key, "' must be positive, got ", v);
    return v;
  };
  const auto non_negative = [&](const char* key, int64_t fallback) {
    const int64_t v = c.get_int(key, fallback);
    KBN_CHECK(v >= 0, "config ", c.source(), ": key '", key, "' must not be negative, got ", v);
    return v;
  };
  d.vocab_size = positive("vocab_size");
  d.hidden_size = positive("hidden_size");
  d.intermediate_size = positive("intermediate_size");
  d.num_hidden_layers = positive("num_hidden_layers");
  d.num_heads = positive("num_attention_heads");
  d.q_lora_rank = non_negative("q_lora_rank", 0);  // null in V2-Lite's config
  d.kv_lora_rank = positive("kv_lora_rank");
  d.qk_nope_head_dim = positive("qk_nope_head_dim");
  d.qk_rope_head_dim = positive("qk_rope_head_dim");
  KBN_CHECK(d.qk_rope_head_dim % 2 == 0, "config ", c.source(), ": key 'qk_rope_head_dim' must be even (rotary pairs), got ",
            d.qk_rope_head_dim);
  d.v_head_dim = positive("v_head_dim");
  d.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  KBN_CHECK(d.rms_norm_eps > 0, "config ", c.source(), ": key 'rms_norm_eps' must be positive, got ", d.rms_norm_eps);
  d.rope = parse_rope_config(c, 10000.0);
  d.max_position_embeddings = positive("max_position_embeddings");
  d.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  KBN_CHECK(!c.get_bool("attention_bias", false), "config ", c.source(),
            ": 'attention_bias' is true; DeepSeek-V2/V3's projections have no bias (expected false)");
  const std::string act = c.get_string("hidden_act", "silu");
  KBN_CHECK(act == "silu", "config ", c.source(), ": 'hidden_act' must be silu, got '", act, "'");

  d.n_routed_experts = non_negative("n_routed_experts", 0);  // null: a dense model
  if (d.n_routed_experts == 0) return d;
  d.n_shared_experts = non_negative("n_shared_experts", 0);
  d.num_experts_per_tok = positive("num_experts_per_tok");
  KBN_CHECK(d.num_experts_per_tok <= d.n_routed_experts, "config ", c.source(), ": key 'num_experts_per_tok' (",
            d.num_experts_per_tok, ") must be at most 'n_routed_experts' (", d.n_routed_experts, ")");
  d.moe_intermediate_size = positive("moe_intermediate_size");
  d.first_k_dense_replace = non_negative("first_k_dense_replace", 0);
  d.moe_layer_freq = c.get_int("moe_layer_freq", 1);
  KBN_CHECK(d.moe_layer_freq > 0, "config ", c.source(), ": key 'moe_layer_freq' must be positive, got ",
            d.moe_layer_freq);
  d.routed_scaling_factor = c.get_double("routed_scaling_factor", 1.0);
  KBN_CHECK(d.routed_scaling_factor > 0, "config ", c.source(), ": key 'routed_scaling_factor' must be positive, got ",
            d.routed_scaling_factor);
  d.topk_method = c.get_string("topk_method", "greedy");
  KBN_CHECK(d.topk_method == "greedy" || d.topk_method == "group_limited_greedy" || d.topk_method == "noaux_tc",
            "config ", c.source(), ": key 'topk_method' must be greedy, group_limited_greedy or noaux_tc, got '",
            d.topk_method, "'");
  d.scoring_func = c.get_string("scoring_func", "softmax");
  KBN_CHECK(d.scoring_func == "softmax" || d.scoring_func == "sigmoid", "config ", c.source(),
            ": key 'scoring_func' must be softmax or sigmoid, got '", d.scoring_func, "'");
  d.n_group = c.get_int("n_group", 1);
  d.topk_group = c.get_int("topk_group", 1);
  KBN_CHECK(d.n_group > 0 && d.n_routed_experts % d.n_group == 0, "config ", c.source(), ": key 'n_group' (",
            d.n_group, ") must divide 'n_routed_experts' (", d.n_routed_experts, ")");
  KBN_CHECK(d.topk_group > 0 && d.topk_group <= d.n_group, "config ", c.source(), ": key 'topk_group' (",
            d.topk_group, ") must be in [1, n_group = ", d.n_group, "]");
  KBN_CHECK(d.num_experts_per_tok <= d.topk_group * (d.n_routed_experts / d.n_group), "config ", c.source(),
            ": key 'num_experts_per_tok' (", d.num_experts_per_tok, ") exceeds the experts of 'topk_group' (",
            d.topk_group, ") groups of ", d.n_routed_experts / d.n_group);
  d.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  return d;
}

}  // namespace kbn
