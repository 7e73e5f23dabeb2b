#include "L1/fused_rope_kvcache.h"

#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#include "kbn/rope.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, row strides, a params struct, a stream ----

struct RopeKVCacheParams {
  const void* qkv;              // [num_tokens, (num_heads + 2 num_kv_heads) * head_dim], row stride qkv_stride
  const int64_t* positions;     // [num_tokens], stride positions_stride
  const void* cos_sin_cache;    // [max_position, head_dim] contiguous: cos | sin
  const int64_t* slot_mapping;  // [num_tokens], stride slot_stride
  void* q_out;                  // [num_tokens, num_heads * head_dim] contiguous
  void* key_cache;              // [num_slots, num_kv_heads * head_dim] contiguous (T or fp8 e4m3)
  void* value_cache;            // [num_slots, num_kv_heads * head_dim] contiguous (T or fp8 e4m3)
  int64_t qkv_stride, positions_stride, slot_stride, max_position, num_slots;
  int num_heads, num_kv_heads;
  float k_scale, v_scale;  // fp8 pages: each element is float(x) / scale, rounded once
};

constexpr int kWarps = 4;

// A lane's N values to the pages: the same bits (16-bit pages), or each float(x) / scale rounded once to e4m3
// (fp8x4_e4m3, store_kvcache's conversion).
template <class T, bool kFp8>
__device__ __forceinline__ void store_lane(void* cache, int64_t index, const Vec16<T>& x, float scale) {
  constexpr int N = Vec16<T>::N;
  if constexpr (!kFp8) {
    reinterpret_cast<Vec16<T>*>(static_cast<T*>(cache) + index)[0] = x;
  } else {
    uint32_t w[N / 4];
#pragma unroll
    for (int h = 0; h < N / 4; ++h)
      w[h] = fp8x4_e4m3(to_f32(x.v[4 * h]), to_f32(x.v[4 * h + 1]), to_f32(x.v[4 * h + 2]), to_f32(x.v[4 * h + 3]),
                        scale);
    uint8_t* dst = static_cast<uint8_t*>(cache) + index;
    if constexpr (N == 8)
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    else
      *reinterpret_cast<uint32_t*>(dst) = w[0];
  }
}

// One warp per (token, head) over the q heads then the kv heads of each token; lane l holds features
// [l N, l N + N) of the head in one 16-byte vector (N = 16 / sizeof(T)), so the NeoX partner of lane l's features
// (d + head_dim / 2) sits in lane l ^ kHalf. A q head is rotated into q_out; a kv head's k is rotated and stored, its
// v stored as it is, in the slot of the token (none for slot -1 or past the pages). The rotation is rotary_embedding's
// (kbn/rope.cuh), the store store_kvcache's: the same bits.
template <class T, int kHeadDim, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32) fused_rope_kvcache_kernel(RopeKVCacheParams p, int64_t rows) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = V::N;
  constexpr int kVecs = kHeadDim / N;  // lanes holding the head
  constexpr int kHalf = kVecs / 2;     // lanes between a NeoX pair's two features
  static_assert(kVecs <= 32 && kVecs % 2 == 0 && (kHalf & (kHalf - 1)) == 0, "a head in one warp, NeoX halves");
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together: rows are warp-uniform
  const int heads = p.num_heads + p.num_kv_heads;
  const int64_t t = row / heads;
  const int head = int(row - t * heads);
  const bool is_q = head < p.num_heads;
  const T* x = static_cast<const T*>(p.qkv) + t * p.qkv_stride + int64_t(head) * kHeadDim;  // q, then k heads
  int64_t slot = -1;
  if (!is_q) {
    slot = p.slot_mapping[t * p.slot_stride];
    if (slot >= p.num_slots) slot = -1;
    if (slot < 0) return;  // a padding token: its k and v are not stored (store_kvcache skips it)
  }

  V v{};  // zero in the lanes past the head (their shuffled words go only to lanes that exit)
  if (lane < kVecs) v = reinterpret_cast<const V*>(x)[lane];
  const V other = shfl_xor_vec16(v, kHalf);  // the partner half (every lane takes part)
  if (lane >= kVecs) return;
  // Outside the table: not rotated, as rotary_embedding leaves it.
  const V result = rope_neox_lane<T, kHeadDim>(v, other, lane, p.positions[t * p.positions_stride],
                                               static_cast<const T*>(p.cos_sin_cache), p.max_position);
  if (is_q) {
    reinterpret_cast<V*>(static_cast<T*>(p.q_out) + (t * p.num_heads + head) * kHeadDim)[lane] = result;
    return;
  }
  const int kvh = head - p.num_heads;
  const int64_t at = (slot * p.num_kv_heads + kvh) * kHeadDim + lane * N;  // element index in the pages
  const V val = reinterpret_cast<const V*>(x + int64_t(p.num_kv_heads) * kHeadDim)[lane];  // v follows the k heads
  store_lane<T, kFp8>(p.key_cache, at, result, p.k_scale);
  store_lane<T, kFp8>(p.value_cache, at, val, p.v_scale);
}

template <class T, bool kFp8>
void launch_for_head(const RopeKVCacheParams& p, int64_t rows, int64_t head_dim, Stream stream) {
  const dim3 grid{unsigned((rows + kWarps - 1) / kWarps)};
  const auto launch = [&](auto kernel) {
    launch_pdl(kernel, grid, kWarps * 32, 0, stream, p, rows);
    KBN_CUDA_CHECK_LAUNCH();
  };
  if (head_dim == 16)
    launch(fused_rope_kvcache_kernel<T, 16, kFp8>);
  else if (head_dim == 32)
    launch(fused_rope_kvcache_kernel<T, 32, kFp8>);
  else if (head_dim == 64)
    launch(fused_rope_kvcache_kernel<T, 64, kFp8>);
  else if (head_dim == 128)
    launch(fused_rope_kvcache_kernel<T, 128, kFp8>);
  else if constexpr (sizeof(T) == 2)
    launch(fused_rope_kvcache_kernel<T, 256, kFp8>);  // head_dim 256 (kernel_supports)
}

template <class T>
void launch_fused_rope_kvcache(const RopeKVCacheParams& p, int64_t num_tokens, int64_t head_dim, bool fp8,
                               Stream stream) {
  const int64_t rows = num_tokens * (p.num_heads + p.num_kv_heads);
  if (rows == 0) return;
  if (fp8)
    launch_for_head<T, true>(p, rows, head_dim, stream);
  else
    launch_for_head<T, false>(p, rows, head_dim, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FusedRopeKVCache::FusedRopeKVCache(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  constexpr const char* op = "FusedRopeKVCache";
  KBN_CHECK(num_heads > 0 && num_kv_heads > 0, op, ": arguments 'num_heads' and 'num_kv_heads' must be positive, got ",
            num_heads, " and ", num_kv_heads);
  KBN_CHECK(head_dim > 0 && head_dim % 2 == 0, op, ": argument 'head_dim' must be positive and even, got ", head_dim);
  KBN_CHECK((num_heads + 2 * num_kv_heads) * head_dim <= std::numeric_limits<int>::max(), op,
            ": too many heads: (num_heads + 2 num_kv_heads) * head_dim = ", (num_heads + 2 * num_kv_heads) * head_dim);
}

bool FusedRopeKVCache::kernel_supports(DType dtype, int64_t head_dim) {
  if (dtype == DType::bf16 || dtype == DType::f16)
    return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  if (dtype == DType::f32) return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
  return false;
}

Tensor FusedRopeKVCache::forward(const Tensor& qkv, const Tensor& positions, const Tensor& cos_sin_cache,
                                 const Tensor& key_cache, const Tensor& value_cache, const Tensor& slot_mapping,
                                 const KVScales& scales) {
  constexpr const char* op = "fused_rope_kvcache";
  const int64_t D = head_dim_, Hq = num_heads_, Hk = num_kv_heads_, width = (Hq + 2 * Hk) * D;
  check_rank(qkv, op, "qkv", 2, "[num_tokens, (num_heads + 2 num_kv_heads) * head_dim]");
  check_dtype(qkv, op, "qkv", {DType::f32, DType::f16, DType::bf16});
  check_size(qkv, op, "qkv", 1, width, "(num_heads + 2 num_kv_heads) * head_dim");
  check_last_dim_contiguous(qkv, op, "qkv");
  const int64_t T = qkv.size(0);
  check_rank(positions, op, "positions", 1, "[num_tokens]");
  check_dtype(positions, op, "positions", {DType::i64});
  check_size(positions, op, "positions", 0, T, "num_tokens");
  check_rank(cos_sin_cache, op, "cos_sin_cache", 2, "[max_position, head_dim]");
  check_size(cos_sin_cache, op, "cos_sin_cache", 1, D, "head_dim (every feature rotates)");
  check_same_dtype(qkv, cos_sin_cache, op, "qkv", "cos_sin_cache");
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  check_rank(key_cache, op, "key_cache", 4, "[num_blocks, block_size, num_kv_heads, head_dim]");
  check_rank(value_cache, op, "value_cache", 4, "[num_blocks, block_size, num_kv_heads, head_dim]");
  // The pages hold qkv's dtype, or fp8 e4m3 (--kv-cache-dtype fp8_e4m3: each element rounded once).
  if (key_cache.dtype() != DType::fp8e4m3) check_same_dtype(qkv, key_cache, op, "qkv", "key_cache");
  check_same_dtype(key_cache, value_cache, op, "key_cache", "value_cache");
  KBN_CHECK(key_cache.shape() == value_cache.shape(), op, ": arguments 'key_cache' ", key_cache.str(),
            " and 'value_cache' ", value_cache.str(), " must have the same shape");
  check_size(key_cache, op, "key_cache", 2, Hk, "num_kv_heads");
  check_size(key_cache, op, "key_cache", 3, D, "head_dim");
  check_contiguous(key_cache, op, "key_cache");
  check_contiguous(value_cache, op, "value_cache");
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i64});
  check_size(slot_mapping, op, "slot_mapping", 0, T, "num_tokens");
  for (const auto& [t, name] : {std::pair{&positions, "positions"}, std::pair{&cos_sin_cache, "cos_sin_cache"},
                                std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"},
                                std::pair{&slot_mapping, "slot_mapping"}})
    check_same_device(qkv, *t, op, "qkv", name);
  check_kv_scales(op, scales, key_cache.dtype());
  Tensor q = Tensor::empty({T, Hq * D}, qkv.dtype(), qkv.device());
  if (T == 0) return q;
  if (qkv.is_cpu()) {
    // The oracle: rotary_embedding on copies of the q and k heads, then reshape_and_cache of k and v.
    q.copy_(qkv.slice(1, 0, Hq * D));
    Tensor k = qkv.slice(1, Hq * D, (Hq + Hk) * D).contiguous();
    reference::rotary_embedding(positions, q, k, D, cos_sin_cache, true);
    const Tensor v = qkv.slice(1, (Hq + Hk) * D, width);
    Tensor kc = key_cache, vc = value_cache;
    reference::reshape_and_cache(k.view({T, Hk, D}), v.as_strided({T, Hk, D}, {v.stride(0), D, 1}, v.offset()), kc,
                                 vc, slot_mapping, scales);
    return q;
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(kernel_supports(qkv.dtype(), D), op, ": argument 'qkv' ", qkv.str(),
            ": the kernel takes head_dim 16, 32, 64, 128 or 256 in bf16 / f16 and 16, 32, 64 or 128 in f32, got head_dim ", D);
  const int64_t es = int64_t(dtype_size(qkv.dtype()));
  KBN_CHECK(aligned16(qkv.data_ptr()) && qkv.stride(0) * es % 16 == 0 && aligned16(cos_sin_cache.data_ptr()) &&
                aligned16(key_cache.data_ptr()) && aligned16(value_cache.data_ptr()),
            op, ": arguments 'qkv' (rows), 'cos_sin_cache', 'key_cache' and 'value_cache' must start on 16-byte ",
            "boundaries, got qkv ", qkv.str());
  const bool fp8 = key_cache.dtype() == DType::fp8e4m3;
  const RopeKVCacheParams p{.qkv = qkv.data_ptr(),
                            .positions = positions.data<int64_t>(),
                            .cos_sin_cache = cos_sin_cache.data_ptr(),
                            .slot_mapping = slot_mapping.data<int64_t>(),
                            .q_out = q.data_ptr(),
                            .key_cache = key_cache.data_ptr(),
                            .value_cache = value_cache.data_ptr(),
                            .qkv_stride = qkv.stride(0),
                            .positions_stride = positions.stride(0),
                            .slot_stride = slot_mapping.stride(0),
                            .max_position = cos_sin_cache.size(0),
                            .num_slots = key_cache.size(0) * key_cache.size(1),
                            .num_heads = int(Hq),
                            .num_kv_heads = int(Hk),
                            .k_scale = fp8 ? float(scales.k) : 1.f,
                            .v_scale = fp8 ? float(scales.v) : 1.f};
  dispatch_float16_32(qkv.dtype(), op, "qkv",
                      [&](auto t) { launch_fused_rope_kvcache<decltype(t)>(p, T, D, fp8, current_stream()); });
#endif
  return q;
}

}  // namespace kbn::KBN_VARIANT
