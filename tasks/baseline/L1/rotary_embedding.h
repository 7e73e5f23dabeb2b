#pragma once
// RotaryEmbedding (vLLM vllm/model_executor/layers/rotary_embedding: RotaryEmbedding and, by
// rope_scaling.rope_type, Llama3RotaryEmbedding ("llama3"), LinearScalingRotaryEmbedding ("linear", Gemma-3's global
// layers) and YaRNScalingRotaryEmbedding ("yarn", gpt-oss)). The variants differ only in the cos/sin cache, built
// once at construction on the host (double math, stored in the model dtype like vLLM; YaRN's attention factor
// multiplies cos and sin); forward rotates query and key in place with the one kernel.
#include <utility>

#include "kbn/config.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t head_size, int64_t rotary_dim, int64_t max_position_embeddings, double base,
                  bool is_neox_style, const RopeScaling& rope_scaling, const ParamOptions& opts = {});

  // positions: [num_tokens] i64; query: [num_tokens, num_heads * head_size] (row stride free) or [num_tokens,
  // num_heads, head_size] (any row and head strides, the features contiguous: e.g. the rope part of wider heads);
  // key: likewise with num_kv_heads. Mutates query and key; returns them.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& query, const Tensor& key);

  int64_t head_size() const { return head_size_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  bool is_neox_style() const { return is_neox_style_; }

  // [max_position, rotary_dim]: cos | sin; a buffer, not a loaded weight. max_position is max_position_embeddings,
  // or for YaRN at least original_max_position_embeddings * factor (vLLM's table length).
  Tensor cos_sin_cache;

 private:
  int64_t head_size_;
  int64_t rotary_dim_;
  bool is_neox_style_;
};

}  // namespace kbn::KBN_VARIANT
