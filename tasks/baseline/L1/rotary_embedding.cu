#include "L1/rotary_embedding.h"

#include <algorithm>
#include <cmath>
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

// ---- kernel layer: raw pointers, row strides, a stream ----

struct RotaryParams {
  const int64_t* positions;                            // [num_tokens] stride positions_stride
  void* query;                                         // [num_tokens, num_heads, head_size] strides (query_stride,
                                                       // query_head_stride, 1)
  void* key;                                           // [num_tokens, num_kv_heads, head_size] likewise
  const void* cos_sin_cache;                           // [max_position, rotary_dim] contiguous: cos | sin
  int64_t positions_stride, query_stride, key_stride;  // in elements
  int64_t query_head_stride, key_head_stride;          // head_size for packed rows; more for a slice of wider heads
  int64_t max_position;
  int num_heads, num_kv_heads, head_size, rotary_dim;
};

constexpr int kMaxThreads = 256;

// Rotates the pair (x, y) by the angle whose cosine and sine are c and s (kbn/rope.cuh: fp32, no contraction).
template <class T>
__device__ __forceinline__ void rotate(T& x, T& y, T c, T s) {
  const T rx = rope_rotated_x(x, y, c, s), ry = rope_rotated_y(x, y, c, s);
  x = rx;
  y = ry;
}

// One block per token: the work items of all query heads and then all key heads share one loop, so the
// threads stay busy across the query/key boundary. A work item is N rotary pairs of one head.
// NeoX pairs are (j, j + rotary_dim / 2); GPT-J pairs are (2j, 2j + 1). Features past rotary_dim are
// left as they are (the op is in place).
// NOTE: kVec (NeoX only) moves 16 bytes per load for x, y, cos and sin: with head_size 128 in bf16 one
// head is 8 work items, so a Llama-3-8B token (32 + 8 heads) is 320 items, 1.25 passes of 256 threads.
// NOTE: positions outside [0, max_position) leave the token untouched instead of reading outside the
// cache (a kernel cannot raise; the engine validates positions).
template <class T, bool kNeox, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) rotary_embedding_kernel(RotaryParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int64_t t = blockIdx.x;
  const int64_t pos = p.positions[t * p.positions_stride];
  if (pos < 0 || pos >= p.max_position) return;
  const int embed = p.rotary_dim / 2;
  const T* cos = static_cast<const T*>(p.cos_sin_cache) + pos * p.rotary_dim;
  const T* sin = cos + embed;
  T* query = static_cast<T*>(p.query) + t * p.query_stride;
  T* key = static_cast<T*>(p.key) + t * p.key_stride;

  const int per_head = embed / N;
  const int items = (p.num_heads + p.num_kv_heads) * per_head;
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    const int head = i / per_head;
    const int j = (i - head * per_head) * N;  // first rotary pair of this item
    T* h = head < p.num_heads ? query + head * p.query_head_stride
                              : key + (head - p.num_heads) * p.key_head_stride;
    if constexpr (kNeox) {
      alignas(16) T xv[N], yv[N], cv[N], sv[N];
      if constexpr (kVec) {
        *reinterpret_cast<V*>(xv) = *reinterpret_cast<const V*>(h + j);
        *reinterpret_cast<V*>(yv) = *reinterpret_cast<const V*>(h + embed + j);
        *reinterpret_cast<V*>(cv) = *reinterpret_cast<const V*>(cos + j);
        *reinterpret_cast<V*>(sv) = *reinterpret_cast<const V*>(sin + j);
      } else {
        xv[0] = h[j];
        yv[0] = h[embed + j];
        cv[0] = cos[j];
        sv[0] = sin[j];
      }
#pragma unroll
      for (int k = 0; k < N; ++k) rotate(xv[k], yv[k], cv[k], sv[k]);
      if constexpr (kVec) {
        *reinterpret_cast<V*>(h + j) = *reinterpret_cast<const V*>(xv);
        *reinterpret_cast<V*>(h + embed + j) = *reinterpret_cast<const V*>(yv);
      } else {
        h[j] = xv[0];
        h[embed + j] = yv[0];
      }
    } else {
      T x = h[2 * j], y = h[2 * j + 1];
      rotate(x, y, cos[j], sin[j]);
      h[2 * j] = x;
      h[2 * j + 1] = y;
    }
  }
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class T>
void launch_rotary_embedding(const RotaryParams& p, int64_t num_tokens, bool is_neox, Stream stream) {
  if (num_tokens == 0 || p.rotary_dim == 0 || p.num_heads + p.num_kv_heads == 0) return;
  constexpr int N = Vec16<T>::N;
  const int embed = p.rotary_dim / 2;
  // Every vector access lands on a 16-byte boundary when the rows, the heads and the half-rotation
  // offsets are multiples of 16 bytes (embed % N == 0 covers the cache rows and the y half).
  const bool vec = is_neox && embed % N == 0 && aligned16(p.query, p.query_stride, sizeof(T)) &&
                   aligned16(p.key, p.key_stride, sizeof(T)) && aligned16(p.query, p.query_head_stride, sizeof(T)) &&
                   aligned16(p.key, p.key_head_stride, sizeof(T)) && aligned16(p.cos_sin_cache, 0, sizeof(T));
  const int items = (p.num_heads + p.num_kv_heads) * (vec ? embed / N : embed);
  const int threads = std::clamp((items + 31) / 32 * 32, 32, kMaxThreads);
  const dim3 grid{unsigned(num_tokens)};
  if (vec)
    launch_pdl(rotary_embedding_kernel<T, true, true>, grid, threads, 0, stream, p);
  else if (is_neox)
    launch_pdl(rotary_embedding_kernel<T, true, false>, grid, threads, 0, stream, p);
  else
    launch_pdl(rotary_embedding_kernel<T, false, false>, grid, threads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

RotaryEmbedding::RotaryEmbedding(int64_t head_size, int64_t rotary_dim, int64_t max_position_embeddings, double base,
                                 bool is_neox_style, const RopeScaling& rope_scaling, const ParamOptions& opts)
    : head_size_(head_size), rotary_dim_(rotary_dim), is_neox_style_(is_neox_style) {
  KBN_CHECK(head_size > 0, "RotaryEmbedding: argument 'head_size' must be positive, got ", head_size);
  KBN_CHECK(rotary_dim > 0 && rotary_dim <= head_size && rotary_dim % 2 == 0,
            "RotaryEmbedding: argument 'rotary_dim' must be even and in (0, head_size = ", head_size, "], got ",
            rotary_dim);
  KBN_CHECK(max_position_embeddings > 0, "RotaryEmbedding: argument 'max_position_embeddings' must be positive, got ",
            max_position_embeddings);
  KBN_CHECK(base > 0, "RotaryEmbedding: argument 'base' must be positive, got ", base);
  KBN_CHECK(head_size <= std::numeric_limits<int>::max(), "RotaryEmbedding: argument 'head_size' is too large, got ",
            head_size);
  // YaRN's table covers the stretched context: vLLM sizes it max(ceil(original_max * factor), max_position).
  int64_t max_position = max_position_embeddings;
  if (rope_scaling.rope_type == "yarn") {
    KBN_CHECK(rope_scaling.factor > 0, "RotaryEmbedding: argument 'rope_scaling.factor' must be positive, got ",
              rope_scaling.factor);
    const double stretched = std::ceil(double(rope_scaling.original_max_position_embeddings) * rope_scaling.factor);
    KBN_CHECK(stretched < double(std::numeric_limits<int32_t>::max()),
              "RotaryEmbedding: original_max_position_embeddings * factor is too large, got ", stretched);
    max_position = std::max(max_position, int64_t(stretched));
  }
  // Built in double on the CPU (reference::rope_cos_sin_cache has the variants' formulas), then stored in the model
  // dtype on the model device, as vLLM does. A buffer: no parameter is registered, so loaders never look for it in a
  // checkpoint.
  cos_sin_cache =
      reference::rope_cos_sin_cache(rotary_dim, max_position, base, rope_scaling).to(opts.dtype).to(opts.device);
}

std::pair<Tensor, Tensor> RotaryEmbedding::forward(const Tensor& positions, const Tensor& query, const Tensor& key) {
  constexpr const char* op = "rotary_embedding";
  check_rank(positions, op, "positions", 1, "[num_tokens]");
  check_dtype(positions, op, "positions", {DType::i64});
  // Packed rows [num_tokens, heads * head_size], or heads viewed with their own stride [num_tokens, heads, head_size]
  // (e.g. the rope part of wider heads, as DeepSeek's MLA rotates q's last qk_rope_head_dim features in place):
  // each operand's head count and head stride.
  struct Heads {
    int64_t count, stride;
  };
  const auto heads_of = [&](const Tensor& x, const char* name) {
    KBN_CHECK(x.dim() == 2 || x.dim() == 3, op, ": argument '", name,
              "' must be [num_tokens, heads * head_size] or [num_tokens, heads, head_size], got ", x.str());
    if (x.dim() == 3) {
      check_size(x, op, name, 2, head_size_, "head_size");
      return Heads{x.size(1), x.stride(1)};
    }
    KBN_CHECK(x.size(1) % head_size_ == 0, op, ": argument '", name, "' dimension 1 must be a multiple of head_size ",
              head_size_, ", got ", x.str());
    return Heads{x.size(1) / head_size_, head_size_};
  };
  [[maybe_unused]] const Heads q_heads = heads_of(query, "query"), k_heads = heads_of(key, "key");
  check_dtype(query, op, "query", {DType::f32, DType::f16, DType::bf16});
  check_same_dtype(query, key, op, "query", "key");
  check_same_device(query, key, op, "query", "key");
  check_same_device(query, positions, op, "query", "positions");
  check_same_device(query, cos_sin_cache, op, "query", "cos_sin_cache");
  check_size(query, op, "query", 0, positions.size(0), "num_tokens");
  check_size(key, op, "key", 0, positions.size(0), "num_tokens");
  check_last_dim_contiguous(query, op, "query");
  check_last_dim_contiguous(key, op, "key");
  if (query.is_cpu()) {
    Tensor q = query, k = key;
    reference::rotary_embedding(positions, q, k, head_size_, cos_sin_cache, is_neox_style_);
    return {query, key};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(cos_sin_cache.dtype() == query.dtype(), op, ": the cos/sin cache is ", cos_sin_cache.str(),
            " but 'query' is ", query.str(), "; construct RotaryEmbedding with ParamOptions{dtype} of the model");
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  check_size(cos_sin_cache, op, "cos_sin_cache", 1, rotary_dim_, "rotary_dim");
  const int64_t num_heads = q_heads.count, num_kv_heads = k_heads.count;
  KBN_CHECK(num_heads + num_kv_heads <= std::numeric_limits<int>::max() / head_size_, op,
            ": too many heads in 'query' ", query.str(), " and 'key' ", key.str());
  const RotaryParams p{.positions = positions.data<int64_t>(),
                       .query = query.data_ptr(),
                       .key = key.data_ptr(),
                       .cos_sin_cache = cos_sin_cache.data_ptr(),
                       .positions_stride = positions.stride(0),
                       .query_stride = query.stride(0),
                       .key_stride = key.stride(0),
                       .query_head_stride = q_heads.stride,
                       .key_head_stride = k_heads.stride,
                       .max_position = cos_sin_cache.size(0),
                       .num_heads = int(num_heads),
                       .num_kv_heads = int(num_kv_heads),
                       .head_size = int(head_size_),
                       .rotary_dim = int(rotary_dim_)};
  dispatch_float16_32(query.dtype(), op, "query", [&](auto t) {
    launch_rotary_embedding<decltype(t)>(p, positions.size(0), is_neox_style_, current_stream());
  });
#endif
  return {query, key};
}

}  // namespace kbn::KBN_VARIANT
