#pragma once
// The typed view of a DeepSeek-V2 / V3 config.json (HF DeepseekV2Config / DeepseekV3Config): multi-head latent
// attention (MLA) and, past the first first_k_dense_replace layers, a mixture of experts with shared experts.
// MLA: the query is q_proj(h) (q_lora_rank absent: V2-Lite) or q_b_proj(norm(q_a_proj(h))) (V3), num_heads heads of
// qk_nope_head_dim + qk_rope_head_dim; keys and values come from one latent per token, kv_a_proj_with_mqa(h) =
// [kv_c (kv_lora_rank) | k_pe (qk_rope_head_dim)], kv_c normalised, then up-projected per head by kv_b_proj to
// qk_nope_head_dim of key and v_head_dim of value. The cache holds kv_c_normed | k_pe: latent_size() values per token.
// Routing (vLLM's grouped_topk): softmax or sigmoid scores over n_routed_experts, the top topk_group of n_group
// expert groups kept (V3: a group's score is its top-2 sum of bias-corrected scores), top num_experts_per_tok of
// those, optionally renormalised, times routed_scaling_factor; shared experts are one MLP of
// n_shared_experts * moe_intermediate_size added to every token.
#include <string>

#include "kbn/config.h"

namespace kbn {

struct DeepseekV2Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // the dense layers' MLP
  int64_t num_hidden_layers = 0;
  int64_t num_heads = 0;  // num_attention_heads (num_key_value_heads is not used by MLA)
  int64_t q_lora_rank = 0;  // 0: absent (null in the config), q_proj straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Mixture of experts (n_routed_experts 0: every layer dense).
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double routed_scaling_factor = 1.0;
  std::string topk_method = "greedy";  // greedy, group_limited_greedy, noaux_tc (the score-correction bias)
  std::string scoring_func = "softmax";  // softmax or sigmoid
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One cached row per token: kv_c_normed | k_pe.
  int64_t latent_size() const { return kv_lora_rank + qk_rope_head_dim; }
  // vLLM's rule: experts exist, layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
  bool is_moe_layer(int64_t layer_idx) const;
  // qk_head_dim^-0.5, times yarn_mscale(factor, mscale_all_dim)^2 under YaRN scaling (vLLM's and HF's MLA scale:
  // 1.590 for V2-Lite).
  double softmax_scale() const;

  // Errors name the key and its value.
  static DeepseekV2Config from(const ModelConfig& c);
};

}  // namespace kbn
