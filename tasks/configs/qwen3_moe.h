#pragma once
// The typed view of a Qwen3-MoE config.json (HF Qwen3MoeConfig): Qwen3's attention (per-head q/k norms, head_dim
// given) and, per layer, either a sparse MoE block (num_experts experts of moe_intermediate_size, top
// num_experts_per_tok, weights renormalized when norm_topk_prob) or a dense MLP of intermediate_size.
#include <vector>

#include "configs/qwen3.h"

namespace kbn {

struct Qwen3MoeConfig : Qwen3Config {
  int64_t num_experts = 0;  // 0: every layer dense
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;  // HF's default
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // vLLM's (and HF's) rule: layer i is sparse iff i is not in mlp_only_layers, num_experts > 0 and
  // (i + 1) % decoder_sparse_step == 0.
  bool is_sparse_layer(int64_t layer_idx) const;

  // Errors name the key.
  static Qwen3MoeConfig from(const ModelConfig& c);
};

}  // namespace kbn
