#pragma once
// FusedQKNormRope (vLLM's fused_qk_norm_rope custom op, used by its QK-norm + RoPE fusion for Qwen3 and Gemma-3): the
// per-head RMS norms of q and k and the NeoX rotary embedding of both in one pass over the fused qkv rows. Same
// arithmetic as the three ops it replaces (RMSNorm or GemmaRMSNorm over each head, rounded to the activation dtype,
// then RotaryEmbedding on the rounded values), one kernel instead of three. Unlike vLLM's in-place op it writes q and k
// to new contiguous tensors (what Attention reads) and leaves qkv untouched; v stays a view of the qkv rows.
#include <utility>

#include "kbn/variant.h"

// 1 where the blocks with q/k norms fold the paged store into this op (Attention::forward_qk_norm_rope): off when
// tasks/candidate/ replaces store_kvcache, this op's kernel or the attention layer, so that candidate is reached at
// every token count (a candidate of this header leaves the macro undefined: off too).
#if !defined(KBN_CANDIDATE_REPLACES_L1_store_kvcache_h) && !defined(KBN_CANDIDATE_REPLACES_L1_store_kvcache_cu) && \
    !defined(KBN_CANDIDATE_REPLACES_L1_fused_qk_norm_rope_cu) && !defined(KBN_CANDIDATE_REPLACES_L2_attention_h) && \
    !defined(KBN_CANDIDATE_REPLACES_L2_attention_cu)
#define KBN_QK_NORM_ROPE_STORE_FUSION 1
#else
#define KBN_QK_NORM_ROPE_STORE_FUSION 0
#endif

namespace kbn::KBN_VARIANT {

class FusedQKNormRope : public Module {
 public:
  // weight_offset: 0 for RMSNorm (scale = weight), 1 for GemmaRMSNorm (scale = 1 + weight).
  FusedQKNormRope(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double weight_offset);

  // qkv: [num_tokens, (num_heads + 2 num_kv_heads) * head_dim], last dim contiguous (any row stride);
  // positions: [num_tokens] i64; q_weight, k_weight: [head_dim]; cos_sin_cache: [max_position, head_dim] (cos | sin,
  // RotaryEmbedding's table; every feature rotates, NeoX pairs) -> (q [num_tokens, num_heads * head_dim],
  // k [num_tokens, num_kv_heads * head_dim]), new and contiguous. A position outside [0, max_position) leaves its
  // token's heads normalised but not rotated, as RotaryEmbedding does.
  std::pair<Tensor, Tensor> forward(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight,
                                    const Tensor& k_weight, const Tensor& cos_sin_cache);
  // The same, with store_kvcache folded in (kb-nano's; vLLM fuses the rope with the cache store the same way,
  // fused_rope_kvcache): the normalised, rotated k and v (qkv's v heads as they are) written to the paged caches
  // key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_dim] (contiguous, qkv's dtype: fp8 pages take
  // the separate ops) at slot_mapping [num_tokens] i64 (-1 and slots past the pages skipped, as store_kvcache does).
  // Returns q as forward does; the same bits in q and in the pages as forward then store_kvcache. Mutates the caches.
  Tensor forward_store(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight, const Tensor& k_weight,
                       const Tensor& cos_sin_cache, const Tensor& key_cache, const Tensor& value_cache,
                       const Tensor& slot_mapping);

  // Whether the GPU kernel runs (dtype, head_dim): 16-bit types at head_dim 32, 64, 128 or 256, f32 at 32, 64 or 128
  // (one warp holds a head in 16-byte vectors, the two NeoX halves a power-of-two number of lanes apart). Callers fall
  // back to the three ops elsewhere; forward refuses other head_dims on the GPU by name.
  static bool kernel_supports(DType dtype, int64_t head_dim);

  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  struct Stored {
    const Tensor* key_cache;
    const Tensor* value_cache;
    const Tensor* slot_mapping;
  };
  std::pair<Tensor, Tensor> run(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight,
                                const Tensor& k_weight, const Tensor& cos_sin_cache, const Stored* stored);

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, weight_offset_;
};

}  // namespace kbn::KBN_VARIANT
