#include "configs/qwen3_moe.h"

#include <algorithm>

#include "kbn/error.h"

namespace kbn {

bool Qwen3MoeConfig::is_sparse_layer(int64_t layer_idx) const {
  KBN_CHECK(layer_idx >= 0 && layer_idx < num_hidden_layers, "Qwen3MoeConfig::is_sparse_layer: layer_idx ",
            layer_idx, " is outside [0, num_hidden_layers = ", num_hidden_layers, ")");
  const bool mlp_only = std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer_idx) != mlp_only_layers.end();
  return !mlp_only && num_experts > 0 && (layer_idx + 1) % decoder_sparse_step == 0;
}

Qwen3MoeConfig Qwen3MoeConfig::from(const ModelConfig& c) {
  Qwen3MoeConfig q;
  static_cast<Qwen3Config&>(q) = Qwen3Config::from(c);
  // The published configs say num_experts; transformers 5 saves the same attribute as num_local_experts.
  q.num_experts = c.has("num_experts") ? c.get_int("num_experts") : c.get_int("num_local_experts", 0);
  KBN_CHECK(q.num_experts >= 0, "config ", c.source(), ": key 'num_experts' must not be negative, got ", q.num_experts);
  q.decoder_sparse_step = c.get_int("decoder_sparse_step", 1);
  KBN_CHECK(q.decoder_sparse_step > 0, "config ", c.source(), ": key 'decoder_sparse_step' must be positive, got ",
            q.decoder_sparse_step);
  q.mlp_only_layers = c.get_int_list("mlp_only_layers");
  for (int64_t l : q.mlp_only_layers)
    KBN_CHECK(l >= 0 && l < q.num_hidden_layers, "config ", c.source(), ": key 'mlp_only_layers' holds layer ", l,
              ", outside [0, num_hidden_layers = ", q.num_hidden_layers, ")");
  q.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  if (q.num_experts > 0) {
    q.num_experts_per_tok = c.get_int("num_experts_per_tok");
    KBN_CHECK(q.num_experts_per_tok > 0 && q.num_experts_per_tok <= q.num_experts, "config ", c.source(),
              ": key 'num_experts_per_tok' must be in [1, num_experts = ", q.num_experts, "], got ",
              q.num_experts_per_tok);
    q.moe_intermediate_size = c.get_int("moe_intermediate_size");
    KBN_CHECK(q.moe_intermediate_size > 0, "config ", c.source(),
              ": key 'moe_intermediate_size' must be positive, got ", q.moe_intermediate_size);
  }
  return q;
}

}  // namespace kbn
