#pragma once
// Generic paged attention on CUDA, for what the tensor-core kernels do not cover: f32, head sizes other than 64
// and 128 (up to 256), fp8 e4m3 pages (--kv-cache-dtype fp8_e4m3: read and widened per element, scale 1.0; all of
// prefill's, and decode's off Hopper and outside its tensor-core head sizes), and the per-layer features (sliding
// window, logit soft-cap, sinks; reference::AttentionFeatures has their definitions).
// Correct for every shape, not fast: one block of 4 warps per (query token, query head); warp w takes keys w, w + 4,
// ...; each lane owns head dims lane, lane + 32, ...; an online softmax per warp, merged across warps at the end.
// Decode is the case query_start_loc == nullptr (token t is sequence t, one query each). Included by
// flash_attn_prefill.cu and flash_attn_decode.cu.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "L1/attention_mma.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/tensor.h"

namespace kbn::KBN_VARIANT {
namespace {

constexpr int kGenericMaxHead = 256;
constexpr int kGenericWarps = 4;

struct GenericAttnParams {
  const void* q;          // [num_tokens, num_heads, head_size], strides below
  const void* key_cache;  // [num_blocks, block_size, num_kv_heads, head_size]
  const void* value_cache;  // [num_blocks, block_size, num_kv_heads, head_size_v]
  void* out;                   // [num_tokens, num_heads, head_size_v]
  const int* query_start_loc;  // [num_seqs + 1], or nullptr for decode
  const int* seq_lens;         // [num_seqs]
  const int* block_tables;     // [num_seqs, max_blocks] row stride block_table_stride
  int64_t q_stride_token, q_stride_head, out_stride_token, out_stride_head;
  int64_t k_stride_block, k_stride_slot, k_stride_head;
  int64_t v_stride_block, v_stride_slot, v_stride_head;
  int64_t block_table_stride;
  int num_seqs, block_size, group_size, head_size, head_size_v;
  float scale;
  int sliding_window;     // > 0: keys position - window + 1 .. position; 0: all
  float logits_soft_cap;  // > 0: scores become cap * tanh(score / cap)
  const float* sinks;     // [num_heads] or nullptr: a logit per head in the softmax denominator
  float v_scale;          // fp8 values' per-tensor scale: multiplies the normalised output (1: unscaled)
};

// Parameters for the generic kernel from the op's tensors. query_start_loc is nullptr for decode.
inline GenericAttnParams generic_attention_params(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                                  const Tensor& out, const Tensor* query_start_loc,
                                                  const Tensor& seq_lens, const Tensor& block_tables, int64_t num_heads,
                                                  int64_t num_kv_heads, int64_t head_size, double scale) {
  GenericAttnParams g{};
  g.q = q.data_ptr();
  g.key_cache = key_cache.data_ptr();
  g.value_cache = value_cache.data_ptr();
  g.out = out.data_ptr();
  g.query_start_loc = query_start_loc ? query_start_loc->data<int32_t>() : nullptr;
  g.seq_lens = seq_lens.data<int32_t>();
  g.block_tables = block_tables.data<int32_t>();
  g.q_stride_token = q.stride(0);
  g.q_stride_head = q.stride(1);
  g.out_stride_token = out.stride(0);
  g.out_stride_head = out.stride(1);
  g.k_stride_block = key_cache.stride(0);
  g.k_stride_slot = key_cache.stride(1);
  g.k_stride_head = key_cache.stride(2);
  g.v_stride_block = value_cache.stride(0);
  g.v_stride_slot = value_cache.stride(1);
  g.v_stride_head = value_cache.stride(2);
  g.block_table_stride = block_tables.stride(0);
  g.num_seqs = int(seq_lens.size(0));
  g.block_size = int(key_cache.size(1));
  g.group_size = int(num_heads / num_kv_heads);
  g.head_size = int(head_size);
  g.head_size_v = int(value_cache.size(3));
  g.scale = float(scale);
  g.v_scale = 1.f;
  return g;
}

// The per-layer features of a generic launch, from those of the tensor-core kernels (attn_features: the window
// clamped to int, the sinks as f32 on the device); the generic kernel applies the soft cap to scaled scores itself.
inline void set_generic_features(GenericAttnParams& g, const AttnFeatures& f, double logits_soft_cap) {
  g.sliding_window = f.window;
  g.logits_soft_cap = float(logits_soft_cap);
  g.sinks = f.sinks;
  g.v_scale = f.v_scale;
}

// T: q and out; KV: the pages (T, or __nv_fp8_e4m3).
template <class T, class KV>
__global__ void __launch_bounds__(kGenericWarps * 32) generic_attention_kernel(GenericAttnParams p) {
  constexpr int kPerLane = kGenericMaxHead / 32;
  const int token = blockIdx.x, head = blockIdx.y, kv_head = head / p.group_size;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  int seq = token, last_key = 0;
  if (p.query_start_loc) {  // prefill: find the sequence owning this token
    int lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (p.query_start_loc[mid] <= token)
        lo = mid;
      else
        hi = mid - 1;
    }
    seq = lo;
    const int q_len = p.query_start_loc[seq + 1] - p.query_start_loc[seq];
    last_key = p.seq_lens[seq] - q_len + (token - p.query_start_loc[seq]);
  } else {
    last_key = p.seq_lens[seq] - 1;
  }

  const int first_key = p.sliding_window > 0 ? max(0, last_key - p.sliding_window + 1) : 0;
  const T* q = static_cast<const T*>(p.q) + token * p.q_stride_token + head * p.q_stride_head;
  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < p.head_size ? to_f32(q[d]) * p.scale : 0.f;
    acc[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  const int* table = p.block_tables + int64_t(seq) * p.block_table_stride;
  for (int j = first_key + warp; j <= last_key; j += kGenericWarps) {
    const int64_t block = table[j / p.block_size], slot = j % p.block_size;
    const KV* k = static_cast<const KV*>(p.key_cache) + block * p.k_stride_block + slot * p.k_stride_slot +
                  kv_head * p.k_stride_head;
    const KV* v = static_cast<const KV*>(p.value_cache) + block * p.v_stride_block + slot * p.v_stride_slot +
                  kv_head * p.v_stride_head;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < p.head_size) s += qv[i] * to_f32(k[d]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (p.logits_soft_cap > 0.f) s = p.logits_soft_cap * tanhf(s / p.logits_soft_cap);
    const float m_new = fmaxf(m, s), correction = __expf(m - m_new), w = __expf(s - m_new);
    l = l * correction + w;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * correction + (d < p.head_size_v ? w * to_f32(v[d]) : 0.f);
    }
    m = m_new;
  }

  __shared__ float s_m[kGenericWarps], s_l[kGenericWarps], s_acc[kGenericWarps][kGenericMaxHead];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  // A sink joins the denominator only: it raises the running maximum and adds exp(sink - max) to the sum.
  const float sink = p.sinks ? p.sinks[head] : -INFINITY;
  float m_all = fmaxf(-FLT_MAX, sink);
  for (int w = 0; w < kGenericWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = p.sinks ? __expf(sink - m_all) : 0.f;
  for (int w = 0; w < kGenericWarps; ++w) l_all += s_l[w] * __expf(s_m[w] - m_all);
  T* out = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head;
  for (int d = threadIdx.x; d < p.head_size_v; d += kGenericWarps * 32) {
    float o = 0.f;
    for (int w = 0; w < kGenericWarps; ++w) o += s_acc[w][d] * __expf(s_m[w] - m_all);
    out[d] = from_f32<T>(l_all > 0.f ? o * p.v_scale / l_all : 0.f);
  }
}

// dt: q's dtype; cache_dt: the pages' (dt, or fp8e4m3).
inline void launch_generic_attention(const GenericAttnParams& p, DType dt, DType cache_dt, int64_t num_tokens,
                                     int64_t num_heads, const char* op, Stream stream) {
  KBN_CHECK(p.head_size <= kGenericMaxHead && p.head_size_v <= kGenericMaxHead, op, ": head_size ", p.head_size,
            " (values ", p.head_size_v, ") has no CUDA kernel; supported: 64 and 128 on tensor cores (f16, bf16), any "
            "size up to ", kGenericMaxHead, " on the generic kernel");
  KBN_CHECK(num_heads <= 65535, op, ": at most 65535 heads, got ", num_heads);
  if (num_tokens == 0) return;
  const dim3 grid{unsigned(num_tokens), unsigned(num_heads)};
  dispatch_float16_32(dt, op, "q", [&](auto t) {
    using T = decltype(t);
    if (cache_dt == DType::fp8e4m3)
      generic_attention_kernel<T, __nv_fp8_e4m3><<<grid, kGenericWarps * 32, 0, stream>>>(p);
    else
      generic_attention_kernel<T, T><<<grid, kGenericWarps * 32, 0, stream>>>(p);
    KBN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace
}  // namespace kbn::KBN_VARIANT
