#pragma once
// FusedRopeKVCache (vLLM's RoPE + KV-cache update fusion: PassConfig fuse_rope_kvcache, RopeKVCacheFusionPass): the
// NeoX rotary embedding of q and k and the paged store of k and v in one pass over the fused qkv rows. Same
// arithmetic as the two ops it replaces (RotaryEmbedding's fp32 rotation rounded to the activation dtype, then
// StoreKVCache's copy, or its fp8 e4m3 rounding of x / scale), so the same bits: one kernel instead of two, and q
// comes out contiguous (what the attention kernels read) instead of being copied out of the qkv rows by the layer.
// The rotated k goes only to the pages; qkv is left untouched.
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FusedRopeKVCache : public Module {
 public:
  FusedRopeKVCache(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);

  // qkv: [num_tokens, (num_heads + 2 num_kv_heads) * head_dim], last dim contiguous (any row stride);
  // positions: [num_tokens] i64; cos_sin_cache: [max_position, head_dim] (cos | sin, RotaryEmbedding's table; every
  // feature rotates, NeoX pairs); key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim] contiguous,
  // of qkv's dtype or fp8 e4m3; slot_mapping: [num_tokens] i64 (-1: not stored); scales: vLLM's k_scale / v_scale
  // (fp8 pages only: kbn::check_kv_scales). Returns q [num_tokens, num_heads * head_dim], new and contiguous. Mutates
  // key_cache and value_cache. A position outside [0, max_position) leaves its token's q and k unrotated, as
  // RotaryEmbedding does on the GPU.
  Tensor forward(const Tensor& qkv, const Tensor& positions, const Tensor& cos_sin_cache, const Tensor& key_cache,
                 const Tensor& value_cache, const Tensor& slot_mapping, const KVScales& scales = {});

  // Whether the GPU kernel runs (dtype, head_dim): 16-bit types at head_dim 16, 32, 64, 128 or 256, f32 at 16, 32, 64
  // or 128 (one warp holds a head in 16-byte vectors, the NeoX halves a power-of-two number of lanes apart). Callers
  // fall back to rotary_embedding then store_kvcache elsewhere; forward refuses other head_dims on the GPU by name.
  static bool kernel_supports(DType dtype, int64_t head_dim);

  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};

}  // namespace kbn::KBN_VARIANT
