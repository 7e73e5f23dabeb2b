#include "L1/moe_sum.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: one 16-byte vector of one token per thread; grid x walks the row, y the tokens ----

constexpr int kThreads = 128;
constexpr int kMaxGridY = 65535;

struct MoeSumParams {
  void* out;        // [num_tokens, hidden]
  const void* in;   // [num_tokens, top_k, hidden]
  int64_t num_tokens;
  int hidden, top_k;
};

template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) moe_sum_kernel(MoeSumParams p) {
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= p.hidden / N) return;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    float acc[N] = {};
    const T* in = static_cast<const T*>(p.in) + t * p.top_k * int64_t(p.hidden) + int64_t(i) * N;
    for (int j = 0; j < p.top_k; ++j) {
      alignas(16) T x[N];
      if constexpr (kVec)
        *reinterpret_cast<V*>(x) = *reinterpret_cast<const V*>(in + int64_t(j) * p.hidden);
      else
        x[0] = in[int64_t(j) * p.hidden];
#pragma unroll
      for (int c = 0; c < N; ++c) acc[c] += to_f32(x[c]);
    }
    alignas(16) T o[N];
#pragma unroll
    for (int c = 0; c < N; ++c) o[c] = from_f32<T>(acc[c]);
    T* out = static_cast<T*>(p.out) + t * int64_t(p.hidden) + int64_t(i) * N;
    if constexpr (kVec)
      *reinterpret_cast<V*>(out) = *reinterpret_cast<const V*>(o);
    else
      *out = o[0];
  }
}

template <class T>
void launch_moe_sum(const MoeSumParams& p, Stream stream) {
  if (p.num_tokens == 0 || p.hidden == 0) return;
  constexpr int N = Vec16<T>::N;
  const bool vec = p.hidden % N == 0 && reinterpret_cast<uintptr_t>(p.in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  const int per_row = vec ? p.hidden / N : p.hidden;
  const dim3 grid{unsigned((per_row + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(p.num_tokens, kMaxGridY))};
  if (vec)
    moe_sum_kernel<T, true><<<grid, kThreads, 0, stream>>>(p);
  else
    moe_sum_kernel<T, false><<<grid, kThreads, 0, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Tensor MoeSum::forward(const Tensor& input) {
  constexpr const char* kOp = "moe_sum";
  check_rank(input, kOp, "input", 3, "[num_tokens, top_k, hidden]");
  check_dtype(input, kOp, "input", {DType::f32, DType::f16, DType::bf16});
  check_contiguous(input, kOp, "input");
  KBN_CHECK(input.size(2) <= std::numeric_limits<int>::max() && input.size(1) <= std::numeric_limits<int>::max(), kOp,
            ": argument 'input' is too wide, got ", input.str());
  Tensor out = Tensor::empty({input.size(0), input.size(2)}, input.dtype(), input.device());
  if (input.is_cpu()) {
    reference::moe_sum(out, input);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const MoeSumParams p{.out = out.data_ptr(),
                       .in = input.data_ptr(),
                       .num_tokens = input.size(0),
                       .hidden = int(input.size(2)),
                       .top_k = int(input.size(1))};
  dispatch_float16_32(input.dtype(), kOp, "input", [&](auto t) { launch_moe_sum<decltype(t)>(p, current_stream()); });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
