#pragma once
// The paged attention layer (vLLM vllm/attention/layer.py Attention): stores this step's keys and values
// in the layer's KV cache, then attends. Metadata and caches come from the forward context; the layer
// finds its own cache by the layer index in its prefix ("model.layers.7.self_attn.attn" -> 7).
#include <string>

#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "L1/fused_qk_norm_rope.h"
#include "L1/fused_rope_kvcache.h"
#include "L1/rotary_embedding.h"
#include "L1/store_kvcache.h"
#include "kbn/cache_spec.h"
#include "kbn/forward_context.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Attention : public Module {
 public:
  // The per-layer features, as vLLM's Attention takes them: `sliding_window` (vLLM's per_layer_sliding_window; > 0:
  // each query sees its last sliding_window keys), `logits_soft_cap` (> 0: scores become cap * tanh(score / cap)),
  // and `sinks` ([num_heads], one learned logit per query head joining the softmax denominator: gpt-oss), a
  // parameter the owning block holds and loads (it must outlive this layer; nullptr: none).
  Attention(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads, const std::string& prefix,
            int64_t sliding_window = 0, double logits_soft_cap = 0, const Tensor* sinks = nullptr);

  // query: [num_tokens, num_heads * head_size]; key, value: [num_tokens, num_kv_heads * head_size] (row
  // strides may exceed the width: views into a fused qkv tensor) -> [num_tokens, num_heads * head_size]
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value);

  // The same layer for the blocks whose q and k take the rope alone right before it (Llama, Mixtral, gpt-oss):
  // qkv: [num_tokens, (num_heads + 2 num_kv_heads) * head_size] (any row stride), the fused projection's rows. Where
  // the rope is NeoX over the whole head and fused_rope_kvcache's kernel takes the shapes (always on CPU tensors,
  // where it is the same oracle arithmetic), one kernel rotates q into a new contiguous tensor and writes the rotated
  // k and v to this layer's pages, 16-bit or fp8 (vLLM's RoPE + KV-cache fusion); else `rotary` rotates the q and k
  // views of qkv in place and forward(q, k, v) runs. Either way, the same bits.
  Tensor forward_rope(const Tensor& positions, const Tensor& qkv, RotaryEmbedding& rotary);

  // The same layer for the blocks with per-head q/k norms (Qwen3Attention, Gemma3Attention): qkv as forward_rope takes
  // it; Norm: RMSNorm or GemmaRMSNorm over head_dim, whose weight_offset `fused` was built with. On the GPU, where
  // fused_qk_norm_rope's kernel takes the shapes (NeoX rope over the whole head) and this layer's pages hold qkv's
  // dtype, one kernel normalises and rotates q and k and writes k and v to the pages (FusedQKNormRope::forward_store);
  // else norm_rope_qkv, then forward(q, k, v). The same bits either way.
  template <class Norm>
  Tensor forward_qk_norm_rope(const Tensor& positions, const Tensor& qkv, Norm& q_norm, Norm& k_norm,
                              RotaryEmbedding& rotary, FusedQKNormRope& fused);

  int64_t layer_index() const { return layer_index_; }
  // The per-tensor scales of this layer's fp8 K/V pages (parameters "k_scale", "v_scale", vLLM's names; a
  // checkpoint calibrated for an fp8 KV cache carries them, else 1.0). Used only when the pages are fp8: 16-bit
  // pages are stored unscaled whatever the checkpoint holds, as in vLLM.
  KVScales kv_scales() const;
  // The paged K/V this layer keeps, its window included (the model's cache_specs() lists one per layer).
  LayerCacheSpec cache_spec(DType dtype) const;

 private:
  int64_t num_heads_, head_size_, num_kv_heads_, layer_index_, sliding_window_;
  const Tensor* sinks_;
  // [1] f32 on the host (read at every forward without a device sync), 1.0 until a checkpoint fills them.
  Tensor k_scale_, v_scale_;
  // The attention proper, once this step's keys and values are in `cache`: q [num_tokens, num_heads, head_size]
  // (any token stride) -> [num_tokens, num_heads * head_size].
  Tensor attend(const Tensor& q, KVCache& cache, const Tensor& block_tables, const KVScales& scales);
  // This layer's cache and its group's slot mapping from the forward context, checked against num_tokens.
  KVCache& layer_cache(int64_t num_tokens) const;

  StoreKVCache store_kvcache_;
  FlashAttnPrefill prefill_;
  FlashAttnDecode decode_;
  FusedRopeKVCache rope_kvcache_;
};

// The q/k path of the attention blocks with per-head q/k norms (Qwen3Attention, Gemma3Attention): one
// fused_qk_norm_rope kernel normalising each q and k head inside the fused qkv rows (no copy) into new contiguous q and
// k and rotating them, where its kernel takes the shapes (NeoX rope over the whole head; dtype and head_dim per
// FusedQKNormRope::kernel_supports; always on CPU tensors, where it is the same oracle arithmetic); else the three
// ops it replaces: the norms (the same views, into new tensors), then rotary in place. v stays a view of the qkv rows.
struct NormedQKV {
  Tensor q, k, v;  // q [T, heads * head_dim], k and v [T, kv_heads * head_dim]
};

// Whether fused_qk_norm_rope takes these q/k heads: NeoX rope over the whole head, and on the GPU a dtype and head_dim
// its kernel supports (on CPU tensors it always does: the same oracle arithmetic).
inline bool qk_norm_rope_fuses(const Tensor& qkv, const RotaryEmbedding& rotary, int64_t head_dim) {
  return rotary.is_neox_style() && rotary.rotary_dim() == head_dim &&
         (qkv.is_cpu() || FusedQKNormRope::kernel_supports(qkv.dtype(), head_dim));
}

// qkv: [T, (heads + 2 kv_heads) * head_dim] (any row stride); Norm: RMSNorm or GemmaRMSNorm over head_dim, whose
// weight_offset `fused` was built with.
template <class Norm>
NormedQKV norm_rope_qkv(const Tensor& qkv, const Tensor& positions, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, Norm& q_norm, Norm& k_norm, RotaryEmbedding& rotary,
                        FusedQKNormRope& fused) {
  const int64_t T = qkv.size(0), D = head_dim, q_size = heads * D, kv_size = kv_heads * D;
  const Tensor v = qkv.slice(1, q_size + kv_size, q_size + 2 * kv_size);
  if (qk_norm_rope_fuses(qkv, rotary, D)) {
    auto [q, k] = fused.forward(qkv, positions, q_norm.weight, k_norm.weight, rotary.cos_sin_cache);
    return {q, k, v};
  }
  const Tensor q_heads = qkv.as_strided({T, heads, D}, {qkv.stride(0), D, 1}, qkv.offset());
  const Tensor k_heads = qkv.as_strided({T, kv_heads, D}, {qkv.stride(0), D, 1}, qkv.offset() + q_size);
  NormedQKV out{q_norm.forward(q_heads).view({T, q_size}), k_norm.forward(k_heads).view({T, kv_size}), v};
  rotary.forward(positions, out.q, out.k);
  return out;
}

template <class Norm>
Tensor Attention::forward_qk_norm_rope(const Tensor& positions, const Tensor& qkv, Norm& q_norm, Norm& k_norm,
                                       RotaryEmbedding& rotary, FusedQKNormRope& fused) {
  const int64_t D = head_size_;
  if (!qkv.is_cpu() && qk_norm_rope_fuses(qkv, rotary, D)) {
    const ForwardContext& ctx = get_forward_context();
    const bool pages_match = ctx.kv_caches && layer_index_ < int64_t(ctx.kv_caches->size()) &&
                             (*ctx.kv_caches)[size_t(layer_index_)].key.dtype() == qkv.dtype();
    if (pages_match) {
      KVCache& cache = layer_cache(qkv.size(0));
      const AttentionMetadata& md = *ctx.attn_metadata;
      const Tensor q = fused.forward_store(qkv, positions, q_norm.weight, k_norm.weight, rotary.cos_sin_cache,
                                           cache.key, cache.value, md.slot_mapping_of(cache.kv_group));
      return attend(q.view({qkv.size(0), num_heads_, D}), cache, md.block_tables_of(cache.kv_group), KVScales{});
    }
  }
  const NormedQKV x = norm_rope_qkv(qkv, positions, num_heads_, num_kv_heads_, D, q_norm, k_norm, rotary, fused);
  return forward(x.q, x.k, x.v);
}

}  // namespace kbn::KBN_VARIANT
