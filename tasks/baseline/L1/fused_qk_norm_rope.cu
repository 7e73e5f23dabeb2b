#include "L1/fused_qk_norm_rope.h"

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

struct QKNormRopeParams {
  const void* qkv;            // [num_tokens, (num_heads + 2 num_kv_heads) * head_dim], row stride qkv_stride
  const int64_t* positions;   // [num_tokens], stride positions_stride
  const void* q_weight;       // [head_dim]
  const void* k_weight;       // [head_dim]
  const void* cos_sin_cache;  // [max_position, head_dim] contiguous: cos | sin
  void* q_out;                // [num_tokens, num_heads * head_dim] contiguous
  void* k_out;                // [num_tokens, num_kv_heads * head_dim] contiguous; unused when storing
  // forward_store: k goes to key_cache and v to value_cache at the token's slot instead ([num_slots, num_kv_heads *
  // head_dim] contiguous, T; slot -1 and slots past the pages skipped, as store_kvcache does); nullptr otherwise.
  void* key_cache;
  void* value_cache;
  const int64_t* slots;  // [num_tokens] stride slot_stride
  int64_t qkv_stride, positions_stride, max_position, slot_stride = 0, num_slots = 0;
  int num_heads, num_kv_heads;
  float eps;
  float weight_offset;  // the norm's scale is weight_offset + weight: 0 (RMSNorm) or 1 (GemmaRMSNorm)
};

constexpr int kWarps = 4;

// One warp per (token, head) over the q heads then the k heads of each token; lane l holds features
// [l N, l N + N) of the head in one 16-byte vector (N = 16 / sizeof(T)), so the NeoX partner of lane l's features
// (d + head_dim / 2) sits in lane l ^ kHalf. The three kernels this one replaces, step for step: rms_norm_warp_kernel's
// sum of squares (each lane's 16-byte vector, then the warp's butterfly) and scaling, rounded to T; rotary_embedding's
// rotation of the rounded values (kbn/rope.cuh). So its outputs are the same bits as theirs. When storing
// (p.key_cache set) each token also has its v heads as rows: a v row copies its head to value_cache, a k row writes its
// result to key_cache instead of k_out (store_kvcache's copy of the same values).
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kWarps * 32) fused_qk_norm_rope_kernel(QKNormRopeParams p, int64_t rows) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = V::N;
  constexpr int kVecs = kHeadDim / N;  // lanes holding the head
  constexpr int kHalf = kVecs / 2;     // lanes between a NeoX pair's two features
  static_assert(kVecs <= 32 && kVecs % 2 == 0 && (kHalf & (kHalf - 1)) == 0, "a head in one warp, NeoX halves");
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const bool store = p.key_cache != nullptr;
  const int heads = p.num_heads + (store ? 2 : 1) * p.num_kv_heads;
  const int64_t t = row / heads;
  const int head = int(row - t * heads);
  const bool is_q = head < p.num_heads;
  // q heads, k heads and v heads are adjacent in the qkv row.
  const T* x = static_cast<const T*>(p.qkv) + t * p.qkv_stride + int64_t(head) * kHeadDim;
  int64_t slot = -1;
  if (store && !is_q) {
    slot = p.slots[t * p.slot_stride];
    if (slot >= p.num_slots) slot = -1;
  }
  if (head >= p.num_heads + p.num_kv_heads) {  // a v head (storing only): copied as it is
    if (slot >= 0 && lane < kVecs)
      reinterpret_cast<V*>(static_cast<T*>(p.value_cache) +
                           (slot * p.num_kv_heads + (head - p.num_heads - p.num_kv_heads)) * kHeadDim)[lane] =
          reinterpret_cast<const V*>(x)[lane];
    return;
  }

  V v;
  float ss = 0.f;
  if (lane < kVecs) {
    v = reinterpret_cast<const V*>(x)[lane];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float z = to_f32(v.v[j]);
      ss += z * z;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv_rms = rsqrtf(ss / float(kHeadDim) + p.eps);
  V normed{};  // zero in the lanes past the head (their shuffled words go only to lanes that exit)
  if (lane < kVecs) {
    const V wv = static_cast<const V*>(is_q ? p.q_weight : p.k_weight)[lane];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float wf = to_f32(wv.v[j]);
      normed.v[j] = from_f32<T>(to_f32(v.v[j]) * inv_rms * (p.weight_offset != 0.f ? p.weight_offset + wf : wf));
    }
  }
  const V other = shfl_xor_vec16(normed, kHalf);  // the partner half (every lane takes part)
  if (lane >= kVecs) return;
  // Outside the table: normalised but not rotated, as rotary_embedding leaves it.
  const V result = rope_neox_lane<T, kHeadDim>(normed, other, lane, p.positions[t * p.positions_stride],
                                               static_cast<const T*>(p.cos_sin_cache), p.max_position);
  T* out = is_q    ? static_cast<T*>(p.q_out) + (t * p.num_heads + head) * kHeadDim
           : store ? (slot >= 0 ? static_cast<T*>(p.key_cache) + (slot * p.num_kv_heads + (head - p.num_heads)) * kHeadDim
                                : nullptr)
                   : static_cast<T*>(p.k_out) + (t * p.num_kv_heads + (head - p.num_heads)) * kHeadDim;
  if (out) reinterpret_cast<V*>(out)[lane] = result;
}

template <class T>
void launch_fused_qk_norm_rope(const QKNormRopeParams& p, int64_t num_tokens, int64_t head_dim, Stream stream) {
  const int64_t rows = num_tokens * (p.num_heads + (p.key_cache ? 2 : 1) * p.num_kv_heads);
  if (rows == 0) return;
  const dim3 grid{unsigned((rows + kWarps - 1) / kWarps)};
  const auto launch = [&](auto kernel) {
    launch_pdl(kernel, grid, kWarps * 32, 0, stream, p, rows);
    KBN_CUDA_CHECK_LAUNCH();
  };
  if (head_dim == 32)
    launch(fused_qk_norm_rope_kernel<T, 32>);
  else if (head_dim == 64)
    launch(fused_qk_norm_rope_kernel<T, 64>);
  else if (head_dim == 128)
    launch(fused_qk_norm_rope_kernel<T, 128>);
  else if constexpr (sizeof(T) == 2)
    launch(fused_qk_norm_rope_kernel<T, 256>);  // head_dim 256 (kernel_supports)
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FusedQKNormRope::FusedQKNormRope(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
                                 double weight_offset)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps), weight_offset_(weight_offset) {
  constexpr const char* op = "FusedQKNormRope";
  KBN_CHECK(num_heads > 0 && num_kv_heads > 0, op, ": arguments 'num_heads' and 'num_kv_heads' must be positive, got ",
            num_heads, " and ", num_kv_heads);
  KBN_CHECK(head_dim > 0 && head_dim % 2 == 0, op, ": argument 'head_dim' must be positive and even, got ", head_dim);
  KBN_CHECK((num_heads + 2 * num_kv_heads) * head_dim <= std::numeric_limits<int>::max(), op,
            ": too many heads: (num_heads + 2 num_kv_heads) * head_dim = ", (num_heads + 2 * num_kv_heads) * head_dim);
  KBN_CHECK(eps >= 0, op, ": argument 'eps' must be non-negative, got ", eps);
  KBN_CHECK(weight_offset == 0.0 || weight_offset == 1.0, op,
            ": argument 'weight_offset' must be 0 (RMSNorm) or 1 (GemmaRMSNorm), got ", weight_offset);
}

bool FusedQKNormRope::kernel_supports(DType dtype, int64_t head_dim) {
  if (dtype == DType::bf16 || dtype == DType::f16)
    return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  if (dtype == DType::f32) return head_dim == 32 || head_dim == 64 || head_dim == 128;
  return false;
}

std::pair<Tensor, Tensor> FusedQKNormRope::forward(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight,
                                                   const Tensor& k_weight, const Tensor& cos_sin_cache) {
  return run(qkv, positions, q_weight, k_weight, cos_sin_cache, nullptr);
}

Tensor FusedQKNormRope::forward_store(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight,
                                      const Tensor& k_weight, const Tensor& cos_sin_cache, const Tensor& key_cache,
                                      const Tensor& value_cache, const Tensor& slot_mapping) {
  constexpr const char* op = "fused_qk_norm_rope";
  const int64_t D = head_dim_;
  for (const auto& [c, name] : {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}}) {
    check_rank(*c, op, name, 4, "[num_blocks, block_size, num_kv_heads, head_dim]");
    check_size(*c, op, name, 2, num_kv_heads_, "num_kv_heads");
    check_size(*c, op, name, 3, D, "head_dim");
    check_same_dtype(qkv, *c, op, "qkv", name);  // 16-bit or f32 pages of qkv's dtype (fp8 pages: the separate ops)
    check_same_device(qkv, *c, op, "qkv", name);
    check_contiguous(*c, op, name);
  }
  KBN_CHECK(key_cache.shape() == value_cache.shape(), op, ": arguments 'key_cache' ", key_cache.str(),
            " and 'value_cache' ", value_cache.str(), " must have one shape");
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i64});
  check_size(slot_mapping, op, "slot_mapping", 0, qkv.size(0), "num_tokens");
  check_same_device(qkv, slot_mapping, op, "qkv", "slot_mapping");
  const Stored stored{&key_cache, &value_cache, &slot_mapping};
  return run(qkv, positions, q_weight, k_weight, cos_sin_cache, &stored).first;
}

std::pair<Tensor, Tensor> FusedQKNormRope::run(const Tensor& qkv, const Tensor& positions, const Tensor& q_weight,
                                               const Tensor& k_weight, const Tensor& cos_sin_cache,
                                               const Stored* stored) {
  constexpr const char* op = "fused_qk_norm_rope";
  const int64_t D = head_dim_, width = (num_heads_ + 2 * num_kv_heads_) * D;
  check_rank(qkv, op, "qkv", 2, "[num_tokens, (num_heads + 2 num_kv_heads) * head_dim]");
  check_dtype(qkv, op, "qkv", {DType::f32, DType::f16, DType::bf16});
  check_size(qkv, op, "qkv", 1, width, "(num_heads + 2 num_kv_heads) * head_dim");
  check_last_dim_contiguous(qkv, op, "qkv");
  check_rank(positions, op, "positions", 1, "[num_tokens]");
  check_dtype(positions, op, "positions", {DType::i64});
  check_size(positions, op, "positions", 0, qkv.size(0), "num_tokens");
  for (const auto& [w, name] : {std::pair{&q_weight, "q_weight"}, std::pair{&k_weight, "k_weight"}}) {
    check_rank(*w, op, name, 1, "[head_dim]");
    check_size(*w, op, name, 0, D, "head_dim");
    check_same_dtype(qkv, *w, op, "qkv", name);
    check_same_device(qkv, *w, op, "qkv", name);
    check_contiguous(*w, op, name);
  }
  check_rank(cos_sin_cache, op, "cos_sin_cache", 2, "[max_position, head_dim]");
  check_size(cos_sin_cache, op, "cos_sin_cache", 1, D, "head_dim (every feature rotates)");
  check_same_dtype(qkv, cos_sin_cache, op, "qkv", "cos_sin_cache");
  check_same_device(qkv, cos_sin_cache, op, "qkv", "cos_sin_cache");
  check_same_device(qkv, positions, op, "qkv", "positions");
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  const int64_t T = qkv.size(0);
  Tensor q = Tensor::empty({T, num_heads_ * D}, qkv.dtype(), qkv.device());
  // Storing on the GPU: k goes to the pages only (no k tensor).
  Tensor k = stored && !qkv.is_cpu() ? Tensor() : Tensor::empty({T, num_kv_heads_ * D}, qkv.dtype(), qkv.device());
  if (T == 0) return {q, k};
  if (qkv.is_cpu()) {
    reference::fused_qk_norm_rope(q, k, qkv, positions, q_weight, k_weight, cos_sin_cache, num_heads_, num_kv_heads_,
                                  D, eps_, weight_offset_);
    if (stored) {  // then store_kvcache's oracle
      Tensor kc = *stored->key_cache, vc = *stored->value_cache;
      const Tensor v = qkv.slice(1, (num_heads_ + num_kv_heads_) * D, width);
      reference::reshape_and_cache(k.view({T, num_kv_heads_, D}),
                                   v.as_strided({T, num_kv_heads_, D}, {v.stride(0), D, 1}, v.offset()), kc, vc,
                                   *stored->slot_mapping);
    }
    return {q, k};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(kernel_supports(qkv.dtype(), D), op, ": argument 'qkv' ", qkv.str(),
            ": the kernel takes head_dim 32, 64, 128 or 256 in bf16 / f16 and 32, 64 or 128 in f32, got head_dim ", D);
  const int64_t es = int64_t(dtype_size(qkv.dtype()));
  KBN_CHECK(aligned16(qkv.data_ptr()) && qkv.stride(0) * es % 16 == 0 && aligned16(q_weight.data_ptr()) &&
                aligned16(k_weight.data_ptr()) && aligned16(cos_sin_cache.data_ptr()),
            op, ": arguments 'qkv' (rows), 'q_weight', 'k_weight' and 'cos_sin_cache' must start on 16-byte boundaries, ",
            "got qkv ", qkv.str());
  const QKNormRopeParams p{.qkv = qkv.data_ptr(),
                           .positions = positions.data<int64_t>(),
                           .q_weight = q_weight.data_ptr(),
                           .k_weight = k_weight.data_ptr(),
                           .cos_sin_cache = cos_sin_cache.data_ptr(),
                           .q_out = q.data_ptr(),
                           .k_out = stored ? nullptr : k.data_ptr(),
                           .key_cache = stored ? stored->key_cache->data_ptr() : nullptr,
                           .value_cache = stored ? stored->value_cache->data_ptr() : nullptr,
                           .slots = stored ? stored->slot_mapping->data<int64_t>() : nullptr,
                           .qkv_stride = qkv.stride(0),
                           .positions_stride = positions.stride(0),
                           .max_position = cos_sin_cache.size(0),
                           .slot_stride = stored ? stored->slot_mapping->stride(0) : 0,
                           .num_slots = stored ? stored->key_cache->size(0) * stored->key_cache->size(1) : 0,
                           .num_heads = int(num_heads_),
                           .num_kv_heads = int(num_kv_heads_),
                           .eps = float(eps_),
                           .weight_offset = float(weight_offset_)};
  dispatch_float16_32(qkv.dtype(), op, "qkv",
                      [&](auto t) { launch_fused_qk_norm_rope<decltype(t)>(p, T, D, current_stream()); });
#endif
  return {q, k};
}

}  // namespace kbn::KBN_VARIANT
