#include "L1/gelu_and_mul.h"

#include <algorithm>
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

struct GeluAndMulParams {
  void* out;                     // [num_tokens, d] row stride out_stride
  const void* x;                 // [num_tokens, 2 * d] row stride x_stride: gate = x[:, :d], up = x[:, d:]
  int64_t out_stride, x_stride;  // in elements
  int64_t num_tokens;
  int d;
};

constexpr int kThreads = 128;
constexpr int kMaxGridY = 65535;

// fp32 math with accurate erff / tanhf (the kernel is memory-bound), as vLLM's gelu_kernel and gelu_tanh_kernel:
// exact: g/2 (1 + erf(g / sqrt 2)); tanh: g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
template <bool kTanh>
__device__ __forceinline__ float gelu_mul(float g, float up) {
  if constexpr (kTanh) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    return 0.5f * g * (1.f + tanhf(kBeta * (g + kKappa * g * g * g))) * up;
  } else {
    constexpr float kInvSqrt2 = 0.7071067811865476f;
    return 0.5f * g * (1.f + erff(g * kInvSqrt2)) * up;
  }
}

// Grid: x walks the row in chunks of kThreads vectors (one 16-byte vector per thread), y walks tokens; the layout
// and the vector choice are silu_and_mul's (L1/silu_and_mul.cu has the reasoning).
template <class T, bool kVec, bool kTanh>
__global__ void __launch_bounds__(kThreads) gelu_and_mul_kernel(GeluAndMulParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int i = blockIdx.x * kThreads + threadIdx.x;  // vector index within the output row
  if (i >= p.d / N) return;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const T* gate = static_cast<const T*>(p.x) + t * p.x_stride + int64_t(i) * N;
    const T* up = gate + p.d;
    T* out = static_cast<T*>(p.out) + t * p.out_stride + int64_t(i) * N;
    alignas(16) T g[N], u[N], o[N];
    if constexpr (kVec) {
      *reinterpret_cast<V*>(g) = *reinterpret_cast<const V*>(gate);
      *reinterpret_cast<V*>(u) = *reinterpret_cast<const V*>(up);
    } else {
      g[0] = *gate;
      u[0] = *up;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = from_f32<T>(gelu_mul<kTanh>(to_f32(g[j]), to_f32(u[j])));
    if constexpr (kVec)
      *reinterpret_cast<V*>(out) = *reinterpret_cast<const V*>(o);
    else
      *out = o[0];
  }
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class T, bool kTanh>
void launch_gelu_and_mul(const GeluAndMulParams& p, Stream stream) {
  if (p.num_tokens == 0 || p.d == 0) return;
  constexpr int N = Vec16<T>::N;
  // Gate and up halves start d elements apart, so d % N == 0 also keeps the up half 16-byte aligned.
  const bool vec = p.d % N == 0 && aligned16(p.x, p.x_stride, sizeof(T)) && aligned16(p.out, p.out_stride, sizeof(T));
  const int per_row = vec ? p.d / N : p.d;
  const dim3 grid{unsigned((per_row + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(p.num_tokens, kMaxGridY))};
  if (vec)
    launch_pdl(gelu_and_mul_kernel<T, true, kTanh>, grid, kThreads, 0, stream, p);
  else
    launch_pdl(gelu_and_mul_kernel<T, false, kTanh>, grid, kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

GeluAndMul::GeluAndMul(const std::string& approximate) : approximate_(approximate) {
  KBN_CHECK(approximate == "none" || approximate == "tanh",
            "GeluAndMul: argument 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\"");
}

Tensor GeluAndMul::forward(const Tensor& x) {
  check_rank(x, "gelu_and_mul", "x", 2, "[num_tokens, 2 * d]");
  check_dtype(x, "gelu_and_mul", "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, "gelu_and_mul", "x");
  KBN_CHECK(x.size(1) % 2 == 0, "gelu_and_mul: argument 'x' dimension 1 (2 * d) must be even, got ", x.str());
  const int64_t d = x.size(1) / 2;
  KBN_CHECK(d <= std::numeric_limits<int>::max(), "gelu_and_mul: argument 'x' row is too wide, got ", x.str());
  Tensor out = Tensor::empty({x.size(0), d}, x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::gelu_and_mul(out, x, approximate_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const GeluAndMulParams p{.out = out.data_ptr(),
                           .x = x.data_ptr(),
                           .out_stride = out.stride(0),
                           .x_stride = x.stride(0),
                           .num_tokens = x.size(0),
                           .d = int(d)};
  const bool tanh = approximate_ == "tanh";
  dispatch_float16_32(x.dtype(), "gelu_and_mul", "x", [&](auto t) {
    if (tanh)
      launch_gelu_and_mul<decltype(t), true>(p, current_stream());
    else
      launch_gelu_and_mul<decltype(t), false>(p, current_stream());
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
