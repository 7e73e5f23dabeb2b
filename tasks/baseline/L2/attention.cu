#include "L2/attention.h"

#include "kbn/checks.h"
#include "kbn/forward_context.h"

namespace kbn::KBN_VARIANT {

Attention::Attention(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads,
                     const std::string& prefix, int64_t sliding_window, double logits_soft_cap, const Tensor* sinks)
    : num_heads_(num_heads),
      head_size_(head_size),
      num_kv_heads_(num_kv_heads),
      layer_index_(extract_layer_index(prefix)),
      sliding_window_(sliding_window),
      sinks_(sinks),
      prefill_(num_heads, head_size, scale, num_kv_heads, sliding_window, logits_soft_cap),
      decode_(num_heads, head_size, scale, num_kv_heads, sliding_window, logits_soft_cap),
      rope_kvcache_(num_heads, num_kv_heads, head_size) {
  // Checkpoints store a scale as a scalar ([]) or [1]; one value per tensor either way (vLLM's per-tensor k_scale /
  // v_scale). It must be finite (the loader checks) and positive.
  auto scale_loader = [](Tensor& param, const Tensor& loaded, std::string_view) {
    KBN_CHECK(loaded.numel() == 1, "expected one per-tensor KV-cache scale (shape [] or [1]), got ", loaded.str(),
              " (per-head or per-channel KV scales are not supported)");
    const float v = loaded.to(Device::cpu()).to_floats()[0];
    KBN_CHECK(v > 0.f, "a KV-cache scale must be positive, got ", v);
    param.copy_(Tensor::from_floats({v}, {1}));
  };
  k_scale_ = Tensor::full({1}, 1.0, DType::f32);
  v_scale_ = Tensor::full({1}, 1.0, DType::f32);
  register_optional_parameter("k_scale", &k_scale_, InitKind::ones, scale_loader);
  register_optional_parameter("v_scale", &v_scale_, InitKind::ones, scale_loader);
}

KVScales Attention::kv_scales() const { return {k_scale_.data<float>()[0], v_scale_.data<float>()[0]}; }

LayerCacheSpec Attention::cache_spec(DType dtype) const {
  return LayerCacheSpec::paged_kv(num_kv_heads_, head_size_, dtype, sliding_window_);
}

// [num_tokens, heads * head_size] with any row stride -> [num_tokens, heads, head_size] view.
static Tensor split_heads(const Tensor& t, int64_t heads, int64_t head_size, const char* arg) {
  check_rank(t, "Attention", arg, 2, "[num_tokens, heads * head_size]");
  check_size(t, "Attention", arg, 1, heads * head_size, "heads * head_size");
  check_last_dim_contiguous(t, "Attention", arg);
  return t.as_strided({t.size(0), heads, head_size}, {t.stride(0), head_size, 1}, t.offset());
}

KVCache& Attention::layer_cache(int64_t num_tokens) const {
  const ForwardContext& ctx = get_forward_context();
  KBN_CHECK(ctx.attn_metadata && ctx.kv_caches,
            "Attention: the forward context has no attention metadata or KV caches");
  KBN_CHECK(layer_index_ < int64_t(ctx.kv_caches->size()), "Attention: layer ", layer_index_, " has no KV cache (",
            ctx.kv_caches->size(), " allocated)");
  KVCache& cache = (*ctx.kv_caches)[size_t(layer_index_)];
  ctx.entering_layer_cache(layer_index_);
  KBN_CHECK(num_tokens == ctx.attn_metadata->num_tokens(), "Attention: ", num_tokens,
            " query tokens but the metadata describes ", ctx.attn_metadata->num_tokens());
  return cache;
}

Tensor Attention::forward(const Tensor& query, const Tensor& key, const Tensor& value) {
  KVCache& cache = layer_cache(query.size(0));
  const AttentionMetadata& md = *get_forward_context().attn_metadata;
  // The layer's KV cache group (models mixing sliding and full layers): its pages follow that group's tables.
  const Tensor& slot_mapping = md.slot_mapping_of(cache.kv_group);
  const Tensor q = split_heads(query, num_heads_, head_size_, "query");
  // The checkpoint's k_scale / v_scale apply to fp8 pages only (16-bit pages hold the values as they are).
  const KVScales scales = cache.key.dtype() == DType::fp8e4m3 ? kv_scales() : KVScales{};
  store_kvcache_.forward(split_heads(key, num_kv_heads_, head_size_, "key"),
                         split_heads(value, num_kv_heads_, head_size_, "value"), cache.key, cache.value, slot_mapping,
                         scales);
  return attend(q, cache, md.block_tables_of(cache.kv_group), scales);
}

Tensor Attention::forward_rope(const Tensor& positions, const Tensor& qkv, RotaryEmbedding& rotary) {
  const int64_t D = head_size_, q_size = num_heads_ * D, kv_size = num_kv_heads_ * D;
  check_rank(qkv, "Attention", "qkv", 2, "[num_tokens, (num_heads + 2 num_kv_heads) * head_size]");
  check_size(qkv, "Attention", "qkv", 1, q_size + 2 * kv_size, "(num_heads + 2 num_kv_heads) * head_size");
  if (!(rotary.is_neox_style() && rotary.rotary_dim() == D &&
        (qkv.is_cpu() || FusedRopeKVCache::kernel_supports(qkv.dtype(), D)))) {
    Tensor q = qkv.slice(1, 0, q_size), k = qkv.slice(1, q_size, q_size + kv_size);
    rotary.forward(positions, q, k);
    return forward(q, k, qkv.slice(1, q_size + kv_size, q_size + 2 * kv_size));
  }
  KVCache& cache = layer_cache(qkv.size(0));
  const AttentionMetadata& md = *get_forward_context().attn_metadata;
  const KVScales scales = cache.key.dtype() == DType::fp8e4m3 ? kv_scales() : KVScales{};
  const Tensor q = rope_kvcache_.forward(qkv, positions, rotary.cos_sin_cache, cache.key, cache.value,
                                         md.slot_mapping_of(cache.kv_group), scales);
  return attend(q.view({qkv.size(0), num_heads_, D}), cache, md.block_tables_of(cache.kv_group), scales);
}

Tensor Attention::attend(const Tensor& q, KVCache& cache, const Tensor& block_tables, const KVScales& scales) {
  const AttentionMetadata& md = *get_forward_context().attn_metadata;
  const int64_t num_tokens = q.size(0);
  // NOTE: the attention kernels take q as [tokens, heads, head_size] contiguous; from forward(), q is a view into the
  // fused qkv output, so this is one copy of q per layer (a fraction of the qkv GEMM's traffic); forward_rope's fused
  // kernel writes it contiguous.
  const int64_t np = md.num_prefill_tokens, nd = md.num_decodes, ns = md.num_prefills;
  Tensor out_p, out_d;
  if (np > 0) {
    const Tensor qp = q.slice(0, 0, np).contiguous(), lens = md.seq_lens.slice(0, 0, ns),
                 tables = block_tables.slice(0, 0, ns);
    out_p = sinks_ ? prefill_.forward(qp, cache.key, cache.value, md.query_start_loc, lens, tables,
                                      md.max_prefill_query_len, md.max_prefill_seq_len, *sinks_, scales)
                   : prefill_.forward(qp, cache.key, cache.value, md.query_start_loc, lens, tables,
                                      md.max_prefill_query_len, md.max_prefill_seq_len, scales);
  }
  if (nd > 0) {
    const Tensor qd = q.slice(0, np, np + nd).contiguous(), lens = md.seq_lens.slice(0, ns, ns + nd),
                 tables = block_tables.slice(0, ns, ns + nd);
    out_d = sinks_ ? decode_.forward(qd, cache.key, cache.value, lens, tables, md.max_decode_seq_len, *sinks_, scales)
                   : decode_.forward(qd, cache.key, cache.value, lens, tables, md.max_decode_seq_len, scales);
  }
  Tensor out;
  if (nd == 0) {
    out = out_p;
  } else if (np == 0) {
    out = out_d;
  } else {
    out = Tensor::empty({num_tokens, num_heads_, head_size_}, q.dtype(), q.device());
    out.slice(0, 0, np).copy_(out_p);
    out.slice(0, np, np + nd).copy_(out_d);
  }
  if (!out.defined()) out = Tensor::empty({0, num_heads_, head_size_}, q.dtype(), q.device());
  return out.view({num_tokens, num_heads_ * head_size_});
}

}  // namespace kbn::KBN_VARIANT
