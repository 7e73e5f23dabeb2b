#include "L1/store_kvcache.h"

#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in copy units, a stream ----

struct StoreKVCacheParams {
  const void* key;              // [num_tokens, num_kv_heads, head_units] token/head strides below
  const void* value;            // [num_tokens, num_kv_heads, head_units] token/head strides below
  void* key_cache;              // [num_slots, num_kv_heads * head_units] contiguous
  void* value_cache;            // [num_slots, num_kv_heads * head_units] contiguous
  const int64_t* slot_mapping;  // [num_tokens] stride slot_stride
  int64_t key_token_stride, key_head_stride, value_token_stride, value_head_stride;
  int64_t slot_stride;
  int64_t num_slots;             // num_blocks * block_size
  int num_kv_heads, head_units;  // head_size * element_size / sizeof(Unit)
};

constexpr int kThreads = 128;

// The slots of tokens t0 .. t0 + kTok - 1; -1 (skip) past num_tokens, for padding and for slots past the cache.
template <int kTok>
__device__ __forceinline__ void block_slots(const StoreKVCacheParams& p, int64_t t0, int64_t num_tokens,
                                            int64_t (&slot)[kTok]) {
#pragma unroll
  for (int j = 0; j < kTok; ++j) {
    const int64_t t = t0 + j;
    slot[j] = t < num_tokens ? p.slot_mapping[t * p.slot_stride] : -1;
    if (slot[j] >= p.num_slots) slot[j] = -1;
  }
}

// One block per kTok tokens copies their key and value rows into slot s of the caches: with contiguous caches
// [num_blocks, block_size, kv_heads, head] the row of slot s (block s / block_size, offset s % block_size)
// starts at s * kv_heads * head, so no division by block_size is needed. Negative slots are padding.
// NOTE: a byte copy, templated on the copy unit (16-byte uint4 when heads and pointers allow, else
// 2 bytes) rather than on the dtype. A Llama-3-8B token (8 kv heads x 128 in bf16) is 128 uint4 per
// cache: with kTok = 1 one key and one value load in flight per thread of a 128-thread block; kTok = 4
// (prefill-size batches) issues four of each before the stores, 1.05-1.07x at 2k-4k tokens on the H200
// (bench/results/h200/tune_store_kvcache_embedding.md).
// NOTE: slots >= num_slots are skipped rather than written out of bounds (a kernel cannot raise).
template <class Unit, int kTok>
__global__ void __launch_bounds__(kThreads) store_kvcache_kernel(StoreKVCacheParams p, int64_t num_tokens) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t t0 = int64_t(blockIdx.x) * kTok;
  int64_t slot[kTok];
  block_slots<kTok>(p, t0, num_tokens, slot);
  const int row_units = p.num_kv_heads * p.head_units;
  const Unit* key = static_cast<const Unit*>(p.key);
  const Unit* value = static_cast<const Unit*>(p.value);
  Unit* key_cache = static_cast<Unit*>(p.key_cache);
  Unit* value_cache = static_cast<Unit*>(p.value_cache);
  for (int i = threadIdx.x; i < row_units; i += kThreads) {
    const int head = i / p.head_units;
    const int u = i - head * p.head_units;
    Unit k[kTok], v[kTok];
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (slot[j] < 0) continue;
      k[j] = key[(t0 + j) * p.key_token_stride + head * p.key_head_stride + u];
      v[j] = value[(t0 + j) * p.value_token_stride + head * p.value_head_stride + u];
    }
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (slot[j] < 0) continue;
      key_cache[slot[j] * row_units + i] = k[j];
      value_cache[slot[j] * row_units + i] = v[j];
    }
  }
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class Unit>
void launch_store_kvcache(StoreKVCacheParams p, int64_t num_tokens, int64_t head_bytes, size_t esize, Stream stream) {
  constexpr int64_t U = sizeof(Unit);
  const int64_t e = int64_t(esize);
  p.head_units = int(head_bytes / U);
  p.key_token_stride = p.key_token_stride * e / U;
  p.key_head_stride = p.key_head_stride * e / U;
  p.value_token_stride = p.value_token_stride * e / U;
  p.value_head_stride = p.value_head_stride * e / U;
  // Four tokens per block once there are enough blocks to fill the GPU several times over: each thread then
  // has four key and four value loads in flight instead of one, and the grid has a quarter of the blocks.
  if (num_tokens >= 2048)
    launch_pdl(store_kvcache_kernel<Unit, 4>, unsigned((num_tokens + 3) / 4), kThreads, 0, stream, p, num_tokens);
  else
    launch_pdl(store_kvcache_kernel<Unit, 1>, unsigned(num_tokens), kThreads, 0, stream, p, num_tokens);
  KBN_CUDA_CHECK_LAUNCH();
}

// An fp8 (e4m3) cache (--kv-cache-dtype fp8_e4m3): each element is converted, rounded to nearest even and saturated
// to +-448 (__nv_fp8_e4m3's constructor, __NV_SATFINITE; NaN stays NaN), as the CPU path's float_to_fp8e4m3 does.
// The pages hold float(x) / scale with the per-tensor scales (vLLM's k_scale / v_scale; 1.0, its default for a
// checkpoint without them, stores the values unscaled: x / 1 is exact). One block per token, a thread per element:
// the fallback for heads that are not a multiple of 8 or unaligned rows (store_kvcache_fp8x8_kernel otherwise).
template <class T>
__global__ void __launch_bounds__(kThreads)
    store_kvcache_fp8_kernel(StoreKVCacheParams p, int head_size, float k_scale, float v_scale) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t * p.slot_stride];
  if (slot < 0 || slot >= p.num_slots) return;
  const int row = p.num_kv_heads * head_size;
  const T* key = static_cast<const T*>(p.key);
  const T* value = static_cast<const T*>(p.value);
  __nv_fp8_e4m3* key_cache = static_cast<__nv_fp8_e4m3*>(p.key_cache) + slot * row;
  __nv_fp8_e4m3* value_cache = static_cast<__nv_fp8_e4m3*>(p.value_cache) + slot * row;
  for (int i = threadIdx.x; i < row; i += kThreads) {
    const int head = i / head_size, d = i - head * head_size;
    key_cache[i] = __nv_fp8_e4m3(float(key[t * p.key_token_stride + head * p.key_head_stride + d]) / k_scale);
    value_cache[i] = __nv_fp8_e4m3(float(value[t * p.value_token_stride + head * p.value_head_stride + d]) / v_scale);
  }
}

// Eight consecutive elements of a head as floats: one 16-byte load of 16-bit values, two of f32.
template <class T>
__device__ __forceinline__ void load8(const T* src, float (&x)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = float(h[i]);
  }
}

// x / scale for eight elements, each rounded once to e4m3 (nearest even, saturated: the scalar kernel's conversion),
// stored as one 8-byte word.
__device__ __forceinline__ void store8_fp8(__nv_fp8_e4m3* dst, const float (&x)[8], float scale) {
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(fp8x4_e4m3(x[0], x[1], x[2], x[3], scale), fp8x4_e4m3(x[4], x[5], x[6], x[7], scale));
}

// The fp8 store eight elements at a time (heads a multiple of 8, 16-byte aligned input chunks, 8-byte aligned
// caches): a Llama-3-8B token row (8 kv heads x 128) is 128 chunks, one per thread, so each thread has its key and
// value loads in flight together instead of the scalar kernel's eight dependent rounds of 2-byte loads (which made
// the fp8 store 2.5x the 16-bit one in the engine). kTok tokens per block as in the 16-bit copy.
template <class T, int kTok>
__global__ void __launch_bounds__(kThreads)
    store_kvcache_fp8x8_kernel(StoreKVCacheParams p, int64_t num_tokens, int head_size, float k_scale, float v_scale) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t t0 = int64_t(blockIdx.x) * kTok;
  int64_t slot[kTok];
  block_slots<kTok>(p, t0, num_tokens, slot);
  const int row = p.num_kv_heads * head_size;
  const T* key = static_cast<const T*>(p.key);
  const T* value = static_cast<const T*>(p.value);
  __nv_fp8_e4m3* key_cache = static_cast<__nv_fp8_e4m3*>(p.key_cache);
  __nv_fp8_e4m3* value_cache = static_cast<__nv_fp8_e4m3*>(p.value_cache);
  for (int e = threadIdx.x * 8; e < row; e += kThreads * 8) {
    const int head = e / head_size, d = e - head * head_size;
    float k[kTok][8], v[kTok][8];
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (slot[j] < 0) continue;
      load8(key + (t0 + j) * p.key_token_stride + head * p.key_head_stride + d, k[j]);
      load8(value + (t0 + j) * p.value_token_stride + head * p.value_head_stride + d, v[j]);
    }
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (slot[j] < 0) continue;
      store8_fp8(key_cache + slot[j] * row + e, k[j], k_scale);
      store8_fp8(value_cache + slot[j] * row + e, v[j], v_scale);
    }
  }
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

void StoreKVCache::forward(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
                           const Tensor& slot_mapping, const KVScales& scales) {
  constexpr const char* op = "store_kvcache";
  check_rank(key, op, "key", 3, "[num_tokens, num_kv_heads, head_size]");
  check_rank(value, op, "value", 3, "[num_tokens, num_kv_heads, head_size]");
  check_rank(key_cache, op, "key_cache", 4, "[num_blocks, block_size, num_kv_heads, head_size]");
  check_rank(value_cache, op, "value_cache", 4, "[num_blocks, block_size, num_kv_heads, head_size]");
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(key, op, "key", {DType::f32, DType::f16, DType::bf16});
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i64});
  check_same_dtype(key, value, op, "key", "value");
  // The caches hold the keys' dtype, or fp8 e4m3 (--kv-cache-dtype fp8_e4m3: each element rounded once).
  if (key_cache.dtype() != DType::fp8e4m3) check_same_dtype(key, key_cache, op, "key", "key_cache");
  check_same_dtype(key_cache, value_cache, op, "key_cache", "value_cache");
  check_same_device(key, value, op, "key", "value");
  check_same_device(key, key_cache, op, "key", "key_cache");
  check_same_device(key, value_cache, op, "key", "value_cache");
  check_same_device(key, slot_mapping, op, "key", "slot_mapping");
  KBN_CHECK(key.shape() == value.shape(), op, ": arguments 'key' ", key.str(), " and 'value' ", value.str(),
            " must have the same shape");
  KBN_CHECK(key_cache.shape() == value_cache.shape(), op, ": arguments 'key_cache' ", key_cache.str(),
            " and 'value_cache' ", value_cache.str(), " must have the same shape");
  check_size(slot_mapping, op, "slot_mapping", 0, key.size(0), "num_tokens");
  check_size(key_cache, op, "key_cache", 2, key.size(1), "num_kv_heads");
  check_size(key_cache, op, "key_cache", 3, key.size(2), "head_size");
  check_last_dim_contiguous(key, op, "key");
  check_last_dim_contiguous(value, op, "value");
  check_contiguous(key_cache, op, "key_cache");
  check_contiguous(value_cache, op, "value_cache");
  check_kv_scales(op, scales, key_cache.dtype());
  if (key.is_cpu()) {
    Tensor kc = key_cache, vc = value_cache;
    reference::reshape_and_cache(key, value, kc, vc, slot_mapping, scales);
    return;
  }
#ifdef KBN_WITH_CUDA
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), head_size = key.size(2);
  if (num_tokens == 0 || num_kv_heads == 0 || head_size == 0) return;
  const StoreKVCacheParams p{.key = key.data_ptr(),
                             .value = value.data_ptr(),
                             .key_cache = key_cache.data_ptr(),
                             .value_cache = value_cache.data_ptr(),
                             .slot_mapping = slot_mapping.data<int64_t>(),
                             .key_token_stride = key.stride(0),
                             .key_head_stride = key.stride(1),
                             .value_token_stride = value.stride(0),
                             .value_head_stride = value.stride(1),
                             .slot_stride = slot_mapping.stride(0),
                             .num_slots = key_cache.size(0) * key_cache.size(1),
                             .num_kv_heads = int(num_kv_heads),
                             .head_units = 0};
  if (key_cache.dtype() == DType::fp8e4m3) {
    KBN_CHECK(num_kv_heads * head_size <= std::numeric_limits<int>::max(), op,
              ": a token row of 'key' is too wide, got ", key.str());
    const size_t es = key.element_size();
    const bool vec8 =
        head_size % 8 == 0 && aligned16(p.key, p.key_token_stride, es) && aligned16(p.key, p.key_head_stride, es) &&
        aligned16(p.value, p.value_token_stride, es) && aligned16(p.value, p.value_head_stride, es) &&
        reinterpret_cast<uintptr_t>(p.key_cache) % 8 == 0 && reinterpret_cast<uintptr_t>(p.value_cache) % 8 == 0;
    dispatch_float16_32(key.dtype(), op, "key", [&](auto t) {
      using T = decltype(t);
      const Stream stream = current_stream();
      if (!vec8)
        launch_pdl(store_kvcache_fp8_kernel<T>, unsigned(num_tokens), kThreads, 0, stream, p, int(head_size), scales.k,
                   scales.v);
      else if (num_tokens >= 2048)
        launch_pdl(store_kvcache_fp8x8_kernel<T, 4>, unsigned((num_tokens + 3) / 4), kThreads, 0, stream, p, num_tokens,
                   int(head_size), scales.k, scales.v);
      else
        launch_pdl(store_kvcache_fp8x8_kernel<T, 1>, unsigned(num_tokens), kThreads, 0, stream, p, num_tokens,
                   int(head_size), scales.k, scales.v);
      KBN_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const size_t es = key.element_size();
  const int64_t head_bytes = head_size * int64_t(es);
  KBN_CHECK(num_kv_heads * head_bytes / 2 <= std::numeric_limits<int>::max(), op,
            ": a token row of 'key' is too wide, got ", key.str());
  const bool vec = head_bytes % 16 == 0 && aligned16(p.key, p.key_token_stride, es) &&
                   aligned16(p.key, p.key_head_stride, es) && aligned16(p.value, p.value_token_stride, es) &&
                   aligned16(p.value, p.value_head_stride, es) && aligned16(p.key_cache, 0, es) &&
                   aligned16(p.value_cache, 0, es);
  // Every supported dtype is 2 or 4 bytes wide, so 2-byte units always divide heads and strides.
  if (vec)
    launch_store_kvcache<uint4>(p, num_tokens, head_bytes, es, current_stream());
  else
    launch_store_kvcache<uint16_t>(p, num_tokens, head_bytes, es, current_stream());
#endif
}

}  // namespace kbn::KBN_VARIANT
