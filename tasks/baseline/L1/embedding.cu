#include "L1/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "kbn/parallel_state.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in copy units, a stream ----

struct EmbeddingParams {
  void* out;           // [num_tokens, row_units] row stride out_stride
  const void* weight;  // [vocab_end - vocab_start, row_units] row stride weight_stride
  const void* ids;     // [num_tokens] stride ids_stride (i32 or i64)
  int64_t out_stride, weight_stride, ids_stride;
  int64_t num_tokens, vocab_start, vocab_end;
  int row_units;  // hidden * element_size / sizeof(Unit)
};

constexpr int kThreads = 128;
constexpr int kMaxGridY = 65535;

// Grid: x walks the row in chunks of kThreads copy units (one per thread), y walks tokens, kTok at a time
// (ids first, then the kTok row loads in flight, then the stores: kTok = 4 for prefill-size batches is
// 1.04-1.06x at 4k-16k tokens on the H200, bench/results/h200/tune_store_kvcache_embedding.md); every thread
// of a block reads the same ids (broadcast loads). Ids outside [vocab_start, vocab_end) write zeros.
// NOTE: the gather is a byte copy, so it is templated on the copy unit (16-byte uint4 when rows and
// pointers allow, else 2 bytes) rather than on the dtype: two kernels serve f32, f16 and bf16 alike.
// NOTE: a 2-D grid instead of one block per token: a 4096-wide bf16 row is 4 blocks, so decode batches
// of 33+ tokens already cover all 132 SMs.
template <class Id, class Unit, int kTok>
__global__ void __launch_bounds__(kThreads) embedding_kernel(EmbeddingParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= p.row_units) return;
  for (int64_t t0 = int64_t(blockIdx.y) * kTok; t0 < p.num_tokens; t0 += int64_t(gridDim.y) * kTok) {
    int64_t id[kTok];
#pragma unroll
    for (int j = 0; j < kTok; ++j)
      id[j] = t0 + j < p.num_tokens ? int64_t(static_cast<const Id*>(p.ids)[(t0 + j) * p.ids_stride]) : -1;
    Unit v[kTok];
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      v[j] = Unit{};
      if (id[j] >= p.vocab_start && id[j] < p.vocab_end)
        v[j] = static_cast<const Unit*>(p.weight)[(id[j] - p.vocab_start) * p.weight_stride + i];
    }
#pragma unroll
    for (int j = 0; j < kTok; ++j)
      if (t0 + j < p.num_tokens) static_cast<Unit*>(p.out)[(t0 + j) * p.out_stride + i] = v[j];
  }
}

template <class Unit>
void launch_embedding(EmbeddingParams p, int64_t row_bytes, size_t esize, DType id_dtype, Stream stream) {
  constexpr int64_t U = sizeof(Unit);
  p.row_units = int(row_bytes / U);
  p.out_stride = p.out_stride * int64_t(esize) / U;
  p.weight_stride = p.weight_stride * int64_t(esize) / U;
  // Four tokens per thread once there are enough to fill the GPU: four id loads, then four row loads in
  // flight per thread, and a quarter of the blocks.
  const bool four = p.num_tokens >= 2048;
  const int64_t steps = four ? (p.num_tokens + 3) / 4 : p.num_tokens;
  const dim3 grid{unsigned((p.row_units + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(steps, kMaxGridY))};
  if (id_dtype == DType::i32) {
    if (four)
      launch_pdl(embedding_kernel<int32_t, Unit, 4>, grid, kThreads, 0, stream, p);
    else
      launch_pdl(embedding_kernel<int32_t, Unit, 1>, grid, kThreads, 0, stream, p);
  } else {
    if (four)
      launch_pdl(embedding_kernel<int64_t, Unit, 4>, grid, kThreads, 0, stream, p);
    else
      launch_pdl(embedding_kernel<int64_t, Unit, 1>, grid, kThreads, 0, stream, p);
  }
  KBN_CUDA_CHECK_LAUNCH();
}

// out[i] = round(out[i] * scale) over a contiguous [num_tokens, hidden] output, in place.
template <class T>
__global__ void __launch_bounds__(256) scale_kernel(T* out, int64_t n, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) * scale);
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

// Rows of this rank's shard; ids outside [vocab_start, vocab_end) give zero rows (tensor parallelism).
static void masked_gather_cpu(Tensor& out, const Tensor& input_ids, const Tensor& weight, int64_t vocab_start,
                              int64_t vocab_end) {
  const std::vector<int64_t> ids = input_ids.to_ints();
  const size_t es = weight.element_size();
  const size_t row_bytes = size_t(weight.size(1)) * es;
  const char* w = static_cast<const char*>(weight.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  for (size_t t = 0; t < ids.size(); ++t) {
    char* dst = o + t * size_t(out.stride(0)) * es;
    const int64_t id = ids[t];
    if (id >= vocab_start && id < vocab_end)
      std::memcpy(dst, w + size_t(id - vocab_start) * size_t(weight.stride(0)) * es, row_bytes);
    else
      std::memset(dst, 0, row_bytes);
  }
}

Tensor Embedding::forward(const Tensor& input_ids, const Tensor& weight, int64_t vocab_start, int64_t vocab_end) {
  constexpr const char* op = "embedding";
  check_rank(input_ids, op, "input_ids", 1, "[num_tokens]");
  check_dtype(input_ids, op, "input_ids", {DType::i32, DType::i64});
  check_rank(weight, op, "weight", 2, "[vocab_end - vocab_start, hidden]");
  check_dtype(weight, op, "weight", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(weight, op, "weight");
  check_same_device(input_ids, weight, op, "input_ids", "weight");
  KBN_CHECK(0 <= vocab_start && vocab_start <= vocab_end && vocab_end - vocab_start <= weight.size(0), op,
            ": need 0 <= vocab_start <= vocab_end and vocab_end - vocab_start <= weight rows; got vocab_start ",
            vocab_start, ", vocab_end ", vocab_end, ", 'weight' ", weight.str());
  const int64_t num_tokens = input_ids.size(0), hidden = weight.size(1);
  Tensor out = Tensor::empty({num_tokens, hidden}, weight.dtype(), weight.device());
  if (weight.is_cpu()) {
    // The oracle when this is the whole vocabulary (it rejects out-of-range ids); a tensor-parallel shard
    // that happens to start at 0 (rank 0) still masks the ids of the other ranks' rows.
    if (vocab_start == 0 && vocab_end == weight.size(0) && parallel_state().tp_size == 1)
      reference::embedding(out, input_ids, weight);
    else
      masked_gather_cpu(out, input_ids, weight, vocab_start, vocab_end);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const size_t es = weight.element_size();
  const int64_t row_bytes = hidden * int64_t(es);
  KBN_CHECK(row_bytes / 2 <= std::numeric_limits<int>::max(), op, ": argument 'weight' row is too wide, got ",
            weight.str());
  if (num_tokens == 0 || hidden == 0) return out;
  const EmbeddingParams p{.out = out.data_ptr(),
                          .weight = weight.data_ptr(),
                          .ids = input_ids.data_ptr(),
                          .out_stride = out.stride(0),
                          .weight_stride = weight.stride(0),
                          .ids_stride = input_ids.stride(0),
                          .num_tokens = num_tokens,
                          .vocab_start = vocab_start,
                          .vocab_end = vocab_end,
                          .row_units = 0};
  const bool vec =
      row_bytes % 16 == 0 && aligned16(p.out, p.out_stride, es) && aligned16(p.weight, p.weight_stride, es);
  // Every supported dtype is 2 or 4 bytes wide, so 2-byte units always divide rows and strides.
  if (vec)
    launch_embedding<uint4>(p, row_bytes, es, input_ids.dtype(), current_stream());
  else
    launch_embedding<uint16_t>(p, row_bytes, es, input_ids.dtype(), current_stream());
#endif
  return out;
}

Tensor Embedding::forward(const Tensor& input_ids, const Tensor& weight, int64_t vocab_start, int64_t vocab_end,
                          double scale) {
  KBN_CHECK(std::isfinite(scale), "embedding: argument 'scale' must be finite, got ", scale);
  Tensor out = forward(input_ids, weight, vocab_start, vocab_end);
  // The scale as the weight's dtype holds it (sqrt(3840) = 61.97 is 62 in bf16).
  const double s = Tensor::from_floats({float(scale)}, {1}, weight.dtype()).to_doubles()[0];
  if (out.numel() == 0) return out;
  if (out.is_cpu()) {
    // A product of two values of the dtype is exact in double; rounding it once to the dtype is the dtype's multiply.
    std::vector<float> v(size_t(out.numel()));
    const std::vector<double> e = out.to_doubles();
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(e[i] * s);
    return Tensor::from_floats(v, out.shape(), out.dtype());
  }
#ifdef KBN_WITH_CUDA
  dispatch_float16_32(out.dtype(), "embedding", "weight", [&](auto t) {
    using T = decltype(t);
    const int64_t n = out.numel();
    const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
    scale_kernel<T><<<blocks, 256, 0, current_stream()>>>(static_cast<T*>(out.data_ptr()), n, float(s));
    KBN_CUDA_CHECK_LAUNCH();
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
