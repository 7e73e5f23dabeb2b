#include "L1/swiglu_oai_and_mul.h"

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
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, row strides, a stream ----

struct SwigluOAIParams {
  void* out;                     // [num_tokens, d] row stride out_stride
  const void* x;                 // [num_tokens, 2 * d] row stride x_stride: gate x[:, 2i], up x[:, 2i + 1]
  int64_t out_stride, x_stride;  // in elements
  int64_t num_tokens;
  int d;
  float alpha, limit;
};

constexpr int kThreads = 128;
constexpr int kMaxGridY = 65535;

// fp32 math with an accurate expf (memory-bound kernel). The clamps are written as comparisons so that a NaN input
// gives a NaN output, as torch.clamp does (fminf would turn a NaN gate into `limit`).
__device__ __forceinline__ float swiglu_oai(float gate, float up, float alpha, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return (u + 1.f) * g / (1.f + expf(-alpha * g));
}

// Grid: x walks the input row in chunks of kThreads 16-byte vectors, y walks tokens. A vector holds N / 2
// (gate, up) pairs and yields N / 2 outputs, stored as one 8-byte word (4 bf16/f16 or 2 f32 values).
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_oai_and_mul_kernel(SwigluOAIParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 2;                  // input elements per thread: N / 2 pairs
  constexpr int M = N / 2;                            // outputs per thread
  const int i = blockIdx.x * kThreads + threadIdx.x;  // output group index within the row
  if (i >= p.d / M) return;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const T* in = static_cast<const T*>(p.x) + t * p.x_stride + int64_t(i) * N;
    T* out = static_cast<T*>(p.out) + t * p.out_stride + int64_t(i) * M;
    alignas(16) T v[N];
    alignas(8) T o[M];
    if constexpr (kVec) {
      *reinterpret_cast<V*>(v) = *reinterpret_cast<const V*>(in);
    } else {
      v[0] = in[0];
      v[1] = in[1];
    }
#pragma unroll
    for (int j = 0; j < M; ++j)
      o[j] = from_f32<T>(swiglu_oai(to_f32(v[2 * j]), to_f32(v[2 * j + 1]), p.alpha, p.limit));
    if constexpr (kVec) {
      static_assert(M * sizeof(T) == 8, "a vector's outputs fill one 8-byte word");
      *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(o);
    } else {
      out[0] = o[0];
    }
  }
}

bool aligned(const void* p, int64_t stride_elems, size_t esize, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && (stride_elems * int64_t(esize)) % int64_t(bytes) == 0;
}

template <class T>
void launch_swiglu_oai_and_mul(const SwigluOAIParams& p, Stream stream) {
  if (p.num_tokens == 0 || p.d == 0) return;
  constexpr int M = Vec16<T>::N / 2;
  const bool vec =
      p.d % M == 0 && aligned(p.x, p.x_stride, sizeof(T), 16) && aligned(p.out, p.out_stride, sizeof(T), 8);
  const int per_row = vec ? p.d / M : p.d;
  const dim3 grid{unsigned((per_row + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(p.num_tokens, kMaxGridY))};
  if (vec)
    launch_pdl(swiglu_oai_and_mul_kernel<T, true>, grid, kThreads, 0, stream, p);
  else
    launch_pdl(swiglu_oai_and_mul_kernel<T, false>, grid, kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

SwigluOAIAndMul::SwigluOAIAndMul(double alpha, double limit) : alpha_(alpha), limit_(limit) {
  KBN_CHECK(std::isfinite(alpha), "SwigluOAIAndMul: argument 'alpha' must be finite, got ", alpha);
  KBN_CHECK(std::isfinite(limit) && limit > 0, "SwigluOAIAndMul: argument 'limit' must be finite and positive, got ",
            limit);
}

Tensor SwigluOAIAndMul::forward(const Tensor& x) {
  constexpr const char* op = "swiglu_oai_and_mul";
  check_rank(x, op, "x", 2, "[num_tokens, 2 * d]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  KBN_CHECK(x.size(1) % 2 == 0, op, ": argument 'x' dimension 1 (2 * d, gate and up interleaved) must be even, got ",
            x.str());
  const int64_t d = x.size(1) / 2;
  KBN_CHECK(d <= std::numeric_limits<int>::max(), op, ": argument 'x' row is too wide, got ", x.str());
  Tensor out = Tensor::empty({x.size(0), d}, x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::swiglu_oai_and_mul(out, x, alpha_, limit_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const SwigluOAIParams p{.out = out.data_ptr(),
                          .x = x.data_ptr(),
                          .out_stride = out.stride(0),
                          .x_stride = x.stride(0),
                          .num_tokens = x.size(0),
                          .d = int(d),
                          .alpha = float(alpha_),
                          .limit = float(limit_)};
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) { launch_swiglu_oai_and_mul<decltype(t)>(p, current_stream()); });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
