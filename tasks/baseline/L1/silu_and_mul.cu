#include "L1/silu_and_mul.h"

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

struct SiluAndMulParams {
  void* out;                     // [num_tokens, d] row stride out_stride
  const void* x;                 // [num_tokens, 2 * d] row stride x_stride: gate = x[:, :d], up = x[:, d:]
  int64_t out_stride, x_stride;  // in elements
  int64_t num_tokens;
  int d;
};

constexpr int kThreads = 128;
constexpr int kMaxGridY = 65535;

// fp32 math: silu(g) * u with an accurate expf (the kernel is memory-bound; the exp is free).
__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }

// Grid: x walks the row in chunks of kThreads vectors (one vector per thread), y walks tokens.
// NOTE: one 16-byte vector per thread and a 2-D grid instead of vLLM's one block per token: the block
// count is (d / 8 / 128) * num_tokens for bf16, e.g. 14 blocks per token at d = 14336, so a decode batch
// of 10+ tokens already spreads over all 132 SMs, and each thread issues its two 16-byte loads at once.
// No index division is needed (the token comes from blockIdx.y).
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) silu_and_mul_kernel(SiluAndMulParams p) {
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
    for (int j = 0; j < N; ++j) o[j] = from_f32<T>(silu_mul(to_f32(g[j]), to_f32(u[j])));
    if constexpr (kVec)
      *reinterpret_cast<V*>(out) = *reinterpret_cast<const V*>(o);
    else
      *out = o[0];
  }
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class T>
void launch_silu_and_mul(const SiluAndMulParams& p, Stream stream) {
  if (p.num_tokens == 0 || p.d == 0) return;
  constexpr int N = Vec16<T>::N;
  // Gate and up halves start d elements apart, so d % N == 0 also keeps the up half 16-byte aligned.
  const bool vec = p.d % N == 0 && aligned16(p.x, p.x_stride, sizeof(T)) && aligned16(p.out, p.out_stride, sizeof(T));
  const int per_row = vec ? p.d / N : p.d;
  const dim3 grid{unsigned((per_row + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(p.num_tokens, kMaxGridY))};
  if (vec)
    launch_pdl(silu_and_mul_kernel<T, true>, grid, kThreads, 0, stream, p);
  else
    launch_pdl(silu_and_mul_kernel<T, false>, grid, kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Tensor SiluAndMul::forward(const Tensor& x) {
  check_rank(x, "silu_and_mul", "x", 2, "[num_tokens, 2 * d]");
  check_dtype(x, "silu_and_mul", "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, "silu_and_mul", "x");
  KBN_CHECK(x.size(1) % 2 == 0, "silu_and_mul: argument 'x' dimension 1 (2 * d) must be even, got ", x.str());
  const int64_t d = x.size(1) / 2;
  KBN_CHECK(d <= std::numeric_limits<int>::max(), "silu_and_mul: argument 'x' row is too wide, got ", x.str());
  Tensor out = Tensor::empty({x.size(0), d}, x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::silu_and_mul(out, x);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const SiluAndMulParams p{.out = out.data_ptr(),
                           .x = x.data_ptr(),
                           .out_stride = out.stride(0),
                           .x_stride = x.stride(0),
                           .num_tokens = x.size(0),
                           .d = int(d)};
  dispatch_float16_32(x.dtype(), "silu_and_mul", "x",
                      [&](auto t) { launch_silu_and_mul<decltype(t)>(p, current_stream()); });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
