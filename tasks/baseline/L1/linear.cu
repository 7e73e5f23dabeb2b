#include "L1/linear.h"

#include <cstdint>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/gemv.cuh"
#include "kbn/cublaslt_linear.h"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: GEMV for one token ----
//
// A one-token linear (batch-1 decode) is a read of its weight. cuBLASLt's kernels read the 8B model's 4096-wide
// weights at only 50-80% of the copy rate there, even the fastest of the heuristic's first 16 algorithms
// (bench/results/h200/tune_linear_gemv.md). One warp per weight row (= output element): every lane streams 16-byte
// vectors of the row, kGemvLoadsInFlight of them before any math, multiplies them with the same vectors of x
// (L1-resident, shared by the SM's warps) and the warp sums its lanes; fp32 accumulation. From two tokens on,
// cuBLASLt's tensor-core kernels are as fast or faster on most shapes, and it takes over.
constexpr int kGemvWarps = 4;
constexpr int kGemvLoadsInFlight = 8;

// out[row] = <weight[row], x> (+ bias[row]) for the warp's row; k is a multiple of the 16-byte vector.
template <class T>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                int n, int k) {
  const int lane = int(threadIdx.x % 32);
  const int row = int(blockIdx.x) * kGemvWarps + int(threadIdx.x / 32);
  if (row >= n) return;
  const uint4* w = reinterpret_cast<const uint4*>(weight + int64_t(row) * k);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int kv = k / int(16 / sizeof(T));  // vectors per row
  float acc = 0.f;
  int i = lane;
  // The weight is a parameter no kernel of the step writes: its first loads go out before the wait for the kernel
  // before this one (dependent launch: kbn/pdl.cuh), under that kernel's tail; x is read after it.
  if (i + 32 * (kGemvLoadsInFlight - 1) < kv) {
    uint4 wv[kGemvLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kGemvLoadsInFlight; ++u) wv[u] = load_weight(w + i + 32 * u);
    pdl_wait();
#pragma unroll
    for (int u = 0; u < kGemvLoadsInFlight; ++u) acc = dot16<T>(wv[u], __ldg(xv + i + 32 * u), acc);
    i += 32 * kGemvLoadsInFlight;
  } else {
    pdl_wait();
  }
  for (; i + 32 * (kGemvLoadsInFlight - 1) < kv; i += 32 * kGemvLoadsInFlight) {
    uint4 wv[kGemvLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kGemvLoadsInFlight; ++u) wv[u] = load_weight(w + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kGemvLoadsInFlight; ++u) acc = dot16<T>(wv[u], __ldg(xv + i + 32 * u), acc);
  }
  for (; i < kv; i += 32) acc = dot16<T>(load_weight(w + i), __ldg(xv + i), acc);
  acc = warp_sum(acc);
  if (lane == 0) out[row] = from_f32<T>(acc + (bias != nullptr ? to_f32(bias[row]) : 0.f));
}

template <class T>
void launch_gemv(T* out, const T* x, const T* weight, const T* bias, int64_t n, int64_t k, Stream stream) {
  const auto grid = unsigned((n + kGemvWarps - 1) / kGemvWarps);
  launch_pdl(gemv_kernel<T>, grid, kGemvWarps * 32, 0, stream, out, x, weight, bias, int(n), int(k));
}

// Whether the GEMV takes this call: one token, and x and weight rows that 16-byte vectors can walk.
bool gemv_applies(const void* x, const void* weight, int64_t m, int64_t n, int64_t k, DType dtype) {
  const int64_t v = 16 / int64_t(dtype_size(dtype));
  return m == 1 && k % v == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(weight) % 16 == 0 && n <= INT32_MAX && k <= INT32_MAX;
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Tensor Linear::forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "linear";
  check_rank(x, op, "x", 2, "[num_tokens, in_features]");
  check_rank(weight, op, "weight", 2, "[out_features, in_features]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_same_dtype(x, weight, op, "x", "weight");
  check_same_device(x, weight, op, "x", "weight");
  check_size(x, op, "x", 1, weight.size(1), "in_features");
  check_last_dim_contiguous(x, op, "x");
  check_contiguous(weight, op, "weight");
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  if (bias.defined()) {
    check_rank(bias, op, "bias", 1, "[out_features]");
    check_same_dtype(x, bias, op, "x", "bias");
    check_same_device(x, bias, op, "x", "bias");
    check_size(bias, op, "bias", 0, n, "out_features");
    check_contiguous(bias, op, "bias");
  }
  KBN_CHECK(k > 0, op, ": argument 'weight' must have in_features > 0, got ", weight.str());
  KBN_CHECK(m <= 1 || x.stride(0) >= k, op, ": argument 'x' rows overlap (row stride below in_features), got ",
            x.str());
  Tensor out = Tensor::empty({m, n}, x.dtype(), x.device());
  if (m == 0 || n == 0) return out;
  if (x.is_cpu()) {
    reference::linear(out, x, weight, bias);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (gemv_applies(x.data_ptr(), weight.data_ptr(), m, n, k, x.dtype())) {
    dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
      using T = decltype(t);
      launch_gemv<T>(static_cast<T*>(out.data_ptr()), static_cast<const T*>(x.data_ptr()),
                     static_cast<const T*>(weight.data_ptr()),
                     bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr, n, k, current_stream());
    });
    return out;
  }
  // A single row has no meaningful row stride; give cuBLAS the tightest legal one.
  cublaslt_linear(out.data_ptr(), x.data_ptr(), weight.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                  {.m = m,
                   .n = n,
                   .k = k,
                   .lda = m == 1 ? k : x.stride(0),
                   .dtype = x.dtype(),
                   .out_dtype = x.dtype(),
                   .has_bias = bias.defined(),
                   .op = op},
                  x.device().index, current_stream());
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
