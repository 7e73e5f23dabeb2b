#include "L1/fused_mla_rope_cache.h"

#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/rms_norm.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device_errors.h"
#include "kbn/pdl.cuh"
#include "kbn/rope.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in elements, a stream ----

struct MlaRopeCacheParams {
  const void* kv_a;            // [num_tokens, rank + rope] token stride kv_a_stride
  void* q;                     // [num_tokens, heads, nope + rope] strides (q_stride, q_head_stride, 1)
  const int64_t* positions;    // [num_tokens] stride positions_stride
  const void* cos_sin;         // [max_position, rope]: cos | sin
  const void* weight;          // [rank]
  void* cache;                 // [num_slots, rank + rope] contiguous
  const int64_t* slots;        // [num_tokens] stride slot_stride
  void* q_abs;                 // [num_tokens - first_decode, heads, rank + rope] strides (q_abs_stride,
                               // q_abs_head_stride, 1), or nullptr
  int64_t kv_a_stride, q_stride, q_head_stride, positions_stride, slot_stride, q_abs_stride, q_abs_head_stride;
  int64_t max_position, num_slots, first_decode;
  int heads, nope, rope, rank;
  float eps;
  DeviceErrorRecord* error;
  int32_t slot_code;
};

constexpr int kThreads = 256;

// One block per token. The latent's norm as rms_norm's register kernel computes it at kThreads threads (thread i
// holds 16-byte vector i, its squares summed in order, then block_sum; rms_norm's one-warp kernel for rows of <= 32
// vectors gives the same sum, the other warps adding zeros), written straight into the token's cache row. Then the
// rotary pairs of every query head and of k_pe share one loop: a query pair is rotated in place (and copied to q_abs
// for a decode token), a k_pe pair goes to the cache row only (kv_a is read, never written). Padding tokens (slot -1)
// still rotate their query; a slot outside the cache is reported and its row left unwritten.
template <class T>
__global__ void __launch_bounds__(kThreads) fused_mla_rope_cache_kernel(MlaRopeCacheParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = V::N;
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slots[t * p.slot_stride];
  const bool outside = slot != -1 && (slot < 0 || slot >= p.num_slots);
  if (outside && threadIdx.x == 0) {
    volatile DeviceErrorRecord* r = p.error;
    r->detail = t;
    r->code = p.slot_code;
  }
  T* row = slot >= 0 && !outside ? static_cast<T*>(p.cache) + slot * int64_t(p.rank + p.rope) : nullptr;
  const T* x = static_cast<const T*>(p.kv_a) + t * p.kv_a_stride;

  const int nvec = p.rank / N;
  V v;
  float ss = 0.f;
  if (int(threadIdx.x) < nvec) {
    v = reinterpret_cast<const V*>(x)[threadIdx.x];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float z = to_f32(v.v[j]);
      ss += z * z;
    }
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.rank) + p.eps);
  if (row && int(threadIdx.x) < nvec) {
    const V w = static_cast<const V*>(p.weight)[threadIdx.x];
    V o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>(to_f32(v.v[j]) * inv_rms * to_f32(w.v[j]));
    reinterpret_cast<V*>(row)[threadIdx.x] = o;
  }

  const int64_t pos = p.positions[t * p.positions_stride];
  const bool rotate = pos >= 0 && pos < p.max_position;
  const int half = p.rope / 2;
  const T* cos = static_cast<const T*>(p.cos_sin) + (rotate ? pos : 0) * p.rope;
  const T* sin = cos + half;
  T* q = static_cast<T*>(p.q) + t * p.q_stride + p.nope;
  T* qa = p.q_abs && t >= p.first_decode
              ? static_cast<T*>(p.q_abs) + (t - p.first_decode) * p.q_abs_stride + p.rank
              : nullptr;
  const int items = (p.heads + 1) * half;
  for (int i = threadIdx.x; i < items; i += kThreads) {
    const int h = i / half, j = i - h * half;
    const T* src = h < p.heads ? q + h * p.q_head_stride : x + p.rank;
    T a = src[2 * j], b = src[2 * j + 1];
    if (rotate) {
      const T c = cos[j], s = sin[j];
      const T ra = rope_rotated_x(a, b, c, s), rb = rope_rotated_y(a, b, c, s);
      a = ra;
      b = rb;
    }
    if (h < p.heads) {
      T* dst = q + h * p.q_head_stride;
      dst[2 * j] = a;
      dst[2 * j + 1] = b;
      if (qa) {
        qa[h * p.q_abs_head_stride + 2 * j] = a;
        qa[h * p.q_abs_head_stride + 2 * j + 1] = b;
      }
    } else if (row) {
      row[p.rank + 2 * j] = a;
      row[p.rank + 2 * j + 1] = b;
    }
  }
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FusedMlaRopeCache::FusedMlaRopeCache(int64_t num_heads, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim,
                                     int64_t kv_lora_rank, double eps)
    : num_heads_(num_heads), nope_(qk_nope_head_dim), rope_(qk_rope_head_dim), rank_(kv_lora_rank), eps_(eps) {
  constexpr const char* op = "FusedMlaRopeCache";
  KBN_CHECK(num_heads > 0, op, ": argument 'num_heads' must be positive, got ", num_heads);
  KBN_CHECK(qk_nope_head_dim >= 0, op, ": argument 'qk_nope_head_dim' must be >= 0, got ", qk_nope_head_dim);
  KBN_CHECK(qk_rope_head_dim > 0 && qk_rope_head_dim % 2 == 0, op,
            ": argument 'qk_rope_head_dim' must be positive and even (GPT-J pairs), got ", qk_rope_head_dim);
  KBN_CHECK(kv_lora_rank > 0, op, ": argument 'kv_lora_rank' must be positive, got ", kv_lora_rank);
  KBN_CHECK(eps > 0, op, ": argument 'eps' must be positive, got ", eps);
}

bool FusedMlaRopeCache::kernel_supports(DType dtype, int64_t kv_lora_rank, int64_t qk_rope_head_dim) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  const int64_t n = 16 / int64_t(dtype_size(dtype));
  return kv_lora_rank > 0 && kv_lora_rank % n == 0 && kv_lora_rank / n <= 256 && qk_rope_head_dim > 0 &&
         qk_rope_head_dim % 2 == 0 && (kv_lora_rank + qk_rope_head_dim) % n == 0;
}

void FusedMlaRopeCache::forward(const Tensor& kv_a, const Tensor& q, const Tensor& positions,
                                const Tensor& cos_sin_cache, const Tensor& norm_weight, const Tensor& kv_cache,
                                const Tensor& slot_mapping, const Tensor& q_abs) {
  constexpr const char* op = "fused_mla_rope_cache";
  const int64_t L = rank_, R = rope_, D = nope_ + rope_, H = num_heads_;
  check_rank(kv_a, op, "kv_a", 2, "[num_tokens, kv_lora_rank + rope]");
  check_rank(q, op, "q", 3, "[num_tokens, num_heads, nope + rope]");
  check_rank(positions, op, "positions", 1, "[num_tokens]");
  check_rank(cos_sin_cache, op, "cos_sin_cache", 2, "[max_position, rope]");
  check_rank(norm_weight, op, "norm_weight", 1, "[kv_lora_rank]");
  check_rank(kv_cache, op, "kv_cache", 3, "[num_blocks, block_size, kv_lora_rank + rope]");
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(kv_a, op, "kv_a", {DType::f32, DType::f16, DType::bf16});
  check_dtype(positions, op, "positions", {DType::i64});
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i64});
  const int64_t T = kv_a.size(0);
  check_size(kv_a, op, "kv_a", 1, L + R, "kv_lora_rank + qk_rope_head_dim");
  check_size(q, op, "q", 0, T, "num_tokens = kv_a.size(0)");
  check_size(q, op, "q", 1, H, "num_heads");
  check_size(q, op, "q", 2, D, "qk_nope_head_dim + qk_rope_head_dim");
  check_size(positions, op, "positions", 0, T, "num_tokens = kv_a.size(0)");
  check_size(cos_sin_cache, op, "cos_sin_cache", 1, R, "qk_rope_head_dim (every rope feature rotates)");
  check_size(norm_weight, op, "norm_weight", 0, L, "kv_lora_rank");
  check_size(kv_cache, op, "kv_cache", 2, L + R, "kv_lora_rank + qk_rope_head_dim");
  check_size(slot_mapping, op, "slot_mapping", 0, T, "num_tokens = kv_a.size(0)");
  for (const auto& [arg, tensor] : {std::pair{"q", &q}, std::pair{"cos_sin_cache", &cos_sin_cache},
                                    std::pair{"norm_weight", &norm_weight}, std::pair{"kv_cache", &kv_cache}}) {
    check_same_dtype(kv_a, *tensor, op, "kv_a", arg);
    check_same_device(kv_a, *tensor, op, "kv_a", arg);
  }
  check_same_device(kv_a, positions, op, "kv_a", "positions");
  check_same_device(kv_a, slot_mapping, op, "kv_a", "slot_mapping");
  check_last_dim_contiguous(kv_a, op, "kv_a");
  check_last_dim_contiguous(q, op, "q");
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  check_contiguous(norm_weight, op, "norm_weight");
  check_contiguous(kv_cache, op, "kv_cache");
  int64_t nd = 0;
  if (q_abs.defined()) {
    check_rank(q_abs, op, "q_abs", 3, "[num_decode, num_heads, kv_lora_rank + rope]");
    nd = q_abs.size(0);
    KBN_CHECK(nd <= T, op, ": argument 'q_abs' ", q_abs.str(), " has more decode tokens than 'kv_a' has tokens (", T,
              ")");
    check_size(q_abs, op, "q_abs", 1, H, "num_heads");
    check_size(q_abs, op, "q_abs", 2, L + R, "kv_lora_rank + qk_rope_head_dim");
    check_same_dtype(kv_a, q_abs, op, "kv_a", "q_abs");
    check_same_device(kv_a, q_abs, op, "kv_a", "q_abs");
    check_last_dim_contiguous(q_abs, op, "q_abs");
  }
  if (kv_a.is_cpu()) {
    // The four ops' oracles in order; k_pe rotated in a copy (kv_a is read only).
    Tensor normed = Tensor::empty({T, L}, kv_a.dtype());
    reference::rms_norm(normed, kv_a.slice(1, 0, L), norm_weight, eps_);
    Tensor k_pe = kv_a.slice(1, L, L + R).clone();  // a copy even where the slice is contiguous (one token)
    Tensor q_pe = q.slice(2, nope_, D);
    reference::rotary_embedding(positions, q_pe, k_pe, R, cos_sin_cache, /*is_neox=*/false);
    Tensor cache = kv_cache;
    reference::concat_and_cache_mla(cache, normed, k_pe, slot_mapping);
    if (nd > 0) q_abs.slice(2, L, L + R).copy_(q_pe.slice(0, T - nd, T));
    return;
  }
#ifdef KBN_WITH_CUDA
  if (T == 0) return;
  KBN_CHECK(kernel_supports(kv_a.dtype(), L, R), op, ": the GPU kernel takes kv_lora_rank in whole 16-byte vectors, ",
            "at most 256 of them, and kv_lora_rank + rope in whole vectors; got kv_lora_rank ", L, ", rope ", R, " in ",
            dtype_name(kv_a.dtype()), " (run rms_norm, rotary_embedding and concat_and_cache_mla instead)");
  check_aligned(kv_a, op, "kv_a", 16);
  check_aligned(norm_weight, op, "norm_weight", 16);
  KBN_CHECK(T <= std::numeric_limits<int32_t>::max(), op, ": argument 'kv_a' has ", T,
            " tokens; the kernel's grid takes at most 2^31 - 1");
  static const int32_t slot_code = device_error_code(
      "fused_mla_rope_cache: argument 'slot_mapping'[{detail}] is outside the cache [0, num_blocks * block_size) "
      "(-1: a padding token); that token's row was not written");
  const MlaRopeCacheParams p{.kv_a = kv_a.data_ptr(),
                             .q = q.data_ptr(),
                             .positions = positions.data<int64_t>(),
                             .cos_sin = cos_sin_cache.data_ptr(),
                             .weight = norm_weight.data_ptr(),
                             .cache = kv_cache.data_ptr(),
                             .slots = slot_mapping.data<int64_t>(),
                             .q_abs = nd > 0 ? q_abs.data_ptr() : nullptr,
                             .kv_a_stride = kv_a.stride(0),
                             .q_stride = q.stride(0),
                             .q_head_stride = q.stride(1),
                             .positions_stride = positions.stride(0),
                             .slot_stride = slot_mapping.stride(0),
                             .q_abs_stride = nd > 0 ? q_abs.stride(0) : 0,
                             .q_abs_head_stride = nd > 0 ? q_abs.stride(1) : 0,
                             .max_position = cos_sin_cache.size(0),
                             .num_slots = kv_cache.size(0) * kv_cache.size(1),
                             .first_decode = T - nd,
                             .heads = int(H),
                             .nope = int(nope_),
                             .rope = int(R),
                             .rank = int(L),
                             .eps = float(eps_),
                             .error = device_error_record(),
                             .slot_code = slot_code};
  dispatch_float16_32(kv_a.dtype(), op, "kv_a", [&](auto tag) {
    launch_pdl(fused_mla_rope_cache_kernel<decltype(tag)>, unsigned(T), kThreads, 0, current_stream(), p);
  });
  KBN_CUDA_CHECK_LAUNCH();
#endif
}

}  // namespace kbn::KBN_VARIANT
