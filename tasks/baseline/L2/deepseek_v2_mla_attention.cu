#include "L2/deepseek_v2_mla_attention.h"

#include <cstdint>
#include <vector>

#include "kbn/checks.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_ops.h"
#endif
#include "kbn/forward_context.h"
#include "kbn/parallel_state.h"

// The latent's norm, the rope, the latent store and q_pe's copy into q_abs run as one kernel (FusedMlaRopeCache) on
// the GPU, except when tasks/candidate/ replaces one of the ops it folds away: a candidate is then reached at every
// token count.
#if defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_h) || defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_cu) ||               \
    defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_cuh) || defined(KBN_CANDIDATE_REPLACES_L1_rotary_embedding_h) ||     \
    defined(KBN_CANDIDATE_REPLACES_L1_rotary_embedding_cu) ||                                                       \
    defined(KBN_CANDIDATE_REPLACES_L1_concat_and_cache_mla_h) ||                                                    \
    defined(KBN_CANDIDATE_REPLACES_L1_concat_and_cache_mla_cu)
#define KBN_MLA_NORM_ROPE_STORE_FUSION 0
#else
#define KBN_MLA_NORM_ROPE_STORE_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

DeepseekV2MLAAttention::DeepseekV2MLAAttention(const DeepseekV2Config& c, const std::string& prefix,
                                               const ParamOptions& opts)
    : kv_a_proj_with_mqa(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, false, false, opts,
                         prefix + ".kv_a_proj_with_mqa"),
      kv_a_layernorm(c.kv_lora_rank, c.rms_norm_eps, opts),
      kv_b_proj(c.kv_lora_rank, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), false, false, opts,
                prefix + ".kv_b_proj"),
      o_proj(c.num_heads * c.v_head_dim, c.hidden_size, false, true, false, true, opts, prefix + ".o_proj"),
      rotary_emb(c.qk_rope_head_dim, c.qk_rope_head_dim, c.max_position_embeddings, c.rope.theta,
                 /*is_neox_style=*/false, c.rope.scaling, opts),
      prefix_(prefix),
      layer_index_(extract_layer_index(prefix)),
      num_heads_(divide_exact(c.num_heads, parallel_state().tp_size, "DeepseekV2MLAAttention num_heads")),
      nope_(c.qk_nope_head_dim),
      rope_(c.qk_rope_head_dim),
      v_dim_(c.v_head_dim),
      rank_(c.kv_lora_rank),
      decode_(num_heads_, c.kv_lora_rank, c.qk_rope_head_dim, c.softmax_scale()),
      prefill_(num_heads_, c.qk_head_dim(), c.softmax_scale(), num_heads_),
      norm_rope_store_(num_heads_, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank, c.rms_norm_eps) {
  KBN_CHECK(c.v_head_dim <= c.qk_head_dim(), "DeepseekV2MLAAttention ", prefix, ": v_head_dim ", c.v_head_dim,
            " wider than qk_head_dim ", c.qk_head_dim(),
            " is not supported (the prefill pads values to the key width)");
  if (c.q_lora_rank > 0) {
    q_a_proj =
        std::make_unique<ReplicatedLinear>(c.hidden_size, c.q_lora_rank, false, false, opts, prefix + ".q_a_proj");
    q_a_layernorm = std::make_unique<RMSNorm>(c.q_lora_rank, c.rms_norm_eps, opts);
    q_b_proj = std::make_unique<ColumnParallelLinear>(c.q_lora_rank, c.num_heads * c.qk_head_dim(), false, false, opts,
                                                      prefix + ".q_b_proj");
    register_module("q_a_proj", q_a_proj.get());
    register_module("q_a_layernorm", q_a_layernorm.get());
    register_module("q_b_proj", q_b_proj.get());
  } else {
    q_proj = std::make_unique<ColumnParallelLinear>(c.hidden_size, c.num_heads * c.qk_head_dim(), false, false, opts,
                                                    prefix + ".q_proj");
    register_module("q_proj", q_proj.get());
  }
  register_module("kv_a_proj_with_mqa", &kv_a_proj_with_mqa);
  register_module("kv_a_layernorm", &kv_a_layernorm);
  register_module("kv_b_proj", &kv_b_proj);
  register_module("o_proj", &o_proj);
}

LayerCacheSpec DeepseekV2MLAAttention::cache_spec(DType dtype) const {
  return LayerCacheSpec::paged_latent(rank_ + rope_, dtype);
}

void DeepseekV2MLAAttention::process_weights_after_loading() {
  // kv_b_proj.weight: [heads * (nope + v), rank], head h's nope key rows then its v value rows.
  const Tensor& w = kv_b_proj.weight;
  const int64_t H = num_heads_, P = nope_, V = v_dim_, L = rank_, R = P + V;
  W_UK_T = w.as_strided({H, L, P}, {R * L, 1, L}, w.offset()).contiguous();
  W_UV = w.as_strided({H, V, L}, {R * L, L, 1}, w.offset() + P * L).contiguous();
}

Tensor DeepseekV2MLAAttention::block_ids(int64_t n, Device device) {
  // NOTE: made anew each step, not kept: a table kept across steps is a tensor allocated after the engine captured
  // its decode graphs, which the caching allocator may place in blocks a capture freed and every replay overwrites
  // (engine/cuda_graph_runner.cpp); tiny DeepSeek-V2's prefills then read garbage pages. One small kernel per layer
  // per prefill step, on the current stream (so each nano-batch's stream has its own).
  if (device.is_cpu()) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    return Tensor::from_i32(ids, {n});
  }
#ifdef KBN_WITH_CUDA
  Tensor ids = Tensor::empty({n}, DType::i32, device);
  cuda::iota_i32(ids.data<int32_t>(), n);
  return ids;
#else
  KBN_FAIL("DeepseekV2MLAAttention: device ", device.str(), " needs a CUDA build");
#endif
}

Tensor DeepseekV2MLAAttention::forward(const Tensor& positions, const Tensor& hidden_states) {
  KBN_CHECK(W_UK_T.defined(), "DeepseekV2MLAAttention (", prefix_,
            "): W_UK_T / W_UV are not made; call process_weights_after_loading() after loading the weights");
  check_rank(hidden_states, "DeepseekV2MLAAttention", "hidden_states", 2, "[num_tokens, hidden_size]");
  const int64_t T = hidden_states.size(0), H = num_heads_, D = nope_ + rope_;
  Tensor q;
  if (q_proj) {
    q = q_proj->forward(hidden_states).first;
  } else {
    const Tensor qa = q_a_layernorm->forward(q_a_proj->forward(hidden_states).first);
    q = q_b_proj->forward(qa).first;
  }
  const Tensor kv_a = kv_a_proj_with_mqa.forward(hidden_states).first;  // [T, rank + rope]
  const Tensor attn = attend(positions, q.view({T, H, D}), kv_a);         // [T, H, v_dim]
  return o_proj.forward(attn.view({T, H * v_dim_})).first;
}

Tensor DeepseekV2MLAAttention::attend(const Tensor& positions, const Tensor& q, const Tensor& kv_a) {
  const ForwardContext& ctx = get_forward_context();
  KBN_CHECK(ctx.attn_metadata && ctx.kv_caches, "DeepseekV2MLAAttention (", prefix_,
            "): the forward context has no attention metadata or caches");
  const AttentionMetadata& md = *ctx.attn_metadata;
  KBN_CHECK(layer_index_ < int64_t(ctx.kv_caches->size()), "DeepseekV2MLAAttention (", prefix_, "): layer ",
            layer_index_, " has no cache (", ctx.kv_caches->size(), " allocated)");
  const Tensor& latent = (*ctx.kv_caches)[size_t(layer_index_)].latent;
  ctx.entering_layer_cache(layer_index_);
  KBN_CHECK(latent.defined(), "DeepseekV2MLAAttention (", prefix_, "): layer ", layer_index_,
            " has no latent cache (its cache spec is paged_latent)");
  const int64_t T = q.size(0), H = num_heads_, D = nope_ + rope_, W = rank_ + rope_;
  KBN_CHECK(T == md.num_tokens(), "DeepseekV2MLAAttention (", prefix_, "): ", T, " tokens but the metadata describes ",
            md.num_tokens());
  const int64_t np = md.num_prefill_tokens, nd = md.num_decodes, ns = md.num_prefills;
  // The decode tokens' absorbed queries [q_nope @ W_UK | q_pe]: the rope tail written with the latent store below.
  const Tensor q_abs = nd > 0 ? Tensor::empty({nd, H, W}, q.dtype(), q.device()) : Tensor();
#if KBN_MLA_NORM_ROPE_STORE_FUSION
  if (!q.is_cpu() && !rotary_emb.is_neox_style() && FusedMlaRopeCache::kernel_supports(q.dtype(), rank_, rope_) &&
      reinterpret_cast<uintptr_t>(kv_a.data_ptr()) % 16 == 0 && kv_a.stride(0) * int64_t(kv_a.element_size()) % 16 == 0) {
    norm_rope_store_.forward(kv_a, q, positions, rotary_emb.cos_sin_cache, kv_a_layernorm.weight, latent,
                             md.slot_mapping, q_abs);
  } else
#endif
  {
    // The same four steps as separate ops: the latent's norm, the rope on q's rope part (in place, the heads' last
    // rope_ features viewed with q's head stride D) and on k_pe (a view into kv_a), the store, q_pe into q_abs.
    const Tensor kv_c_normed = kv_a_layernorm.forward(kv_a.slice(1, 0, rank_));
    const Tensor k_pe = kv_a.slice(1, rank_, W);
    rotary_emb.forward(positions, q.slice(2, nope_, D), k_pe);
    store_.forward(kv_c_normed, k_pe, latent, md.slot_mapping);
    if (nd > 0) q_abs.slice(2, rank_, W).copy_(q.slice(0, np, np + nd).slice(2, nope_, D));
  }

  Tensor out = Tensor::empty({T, H, v_dim_}, q.dtype(), q.device());
  if (np > 0) {
    // Decompress the prefill sequences' rows, Lpad (Lmax rounded up to a page) per sequence, into per-head K
    // [k_nope | k_pe] and V (v_head_dim wide where the prefill kernel takes values narrower than keys: the CPU, and
    // Hopper at 192 / 128; zero-padded to D elsewhere), viewed as a paged cache of 16-row pages, sequence s owning pages
    // s * pages .. s * pages + pages - 1. Pages of 16 (not one page of Lmax per sequence) are what Hopper's TMA
    // prefill kernel reads (pages of 8..64 rows dividing its 64-key tiles); other page sizes run the mma.sync kernel.
    constexpr int64_t kPage = 16;
    const int64_t Lmax = md.max_prefill_seq_len, Lpad = (Lmax + kPage - 1) / kPage * kPage, pages = Lpad / kPage;
    const int64_t rows = ns * Lpad;
    const Tensor lens = md.seq_lens.slice(0, 0, ns), tables = md.block_tables.slice(0, 0, ns);
    const Tensor rows_lat = gather_.forward(latent, tables, lens, Lpad).view({rows, W});
    const Tensor kv = kv_b_proj.forward(rows_lat.slice(1, 0, rank_)).first.view({rows, H, nope_ + v_dim_});
    Tensor key = Tensor::empty({rows, H, D}, q.dtype(), q.device());
    const bool narrow_v = q.is_cpu() || FlashAttnPrefill::value_width_on_tensor_cores(q.dtype(), D, v_dim_, q.device());
    const int64_t Dv = narrow_v ? v_dim_ : D;
    Tensor value = Tensor::empty({rows, H, Dv}, q.dtype(), q.device());
    key.slice(2, 0, nope_).copy_(kv.slice(2, 0, nope_));
    key.slice(2, nope_, D).copy_(rows_lat.as_strided({rows, H, rope_}, {W, 0, 1}, rows_lat.offset() + rank_));
    if (!narrow_v) value.zero_();
    value.slice(2, 0, v_dim_).copy_(kv.slice(2, nope_, nope_ + v_dim_));
    const Tensor ids = block_ids(ns * pages, q.device()).view({ns, pages});
    const Tensor o = prefill_.forward(q.slice(0, 0, np).contiguous(), key.view({ns * pages, kPage, H, D}),
                                      value.view({ns * pages, kPage, H, Dv}), md.query_start_loc, lens, ids,
                                      md.max_prefill_query_len, Lmax);
    out.slice(0, 0, np).copy_(o.slice(2, 0, v_dim_));
  }
  if (nd > 0) {
    // Absorbed: q_abs = [q_nope @ W_UK | q_pe] per head, mla_decode, then @ W_UV per head.
    const Tensor qd = q.slice(0, np, np + nd);
    bmm_.forward(qd.as_strided({H, nd, nope_}, {D, H * D, 1}, qd.offset()), W_UK_T,
                 q_abs.as_strided({H, nd, rank_}, {W, H * W, 1}, q_abs.offset()));
    const Tensor o_lat = decode_.forward(q_abs, latent, md.seq_lens.slice(0, ns, ns + nd),
                                         md.block_tables.slice(0, ns, ns + nd), md.max_decode_seq_len);
    const Tensor od = out.slice(0, np, np + nd);
    bmm_.forward(o_lat.as_strided({H, nd, rank_}, {rank_, H * rank_, 1}, o_lat.offset()), W_UV,
                 od.as_strided({H, nd, v_dim_}, {v_dim_, H * v_dim_, 1}, od.offset()));
  }
  return out;
}

}  // namespace kbn::KBN_VARIANT
