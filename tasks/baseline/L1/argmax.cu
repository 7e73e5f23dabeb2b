#include "L1/argmax.h"

#include <cstdint>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, row strides, a stream ----

struct ArgmaxParams {
  const void* logits;     // [num_tokens, vocab] row stride logits_stride
  int64_t* out;           // [num_tokens]
  int64_t logits_stride;  // in elements
  int vocab;
};

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;

// The best (value, index) seen so far; index < 0 means none yet (every value seen was NaN).
struct Best {
  float value;
  int index;
};

// Candidates reach a thread in increasing index order, so a strict > keeps the lowest index among equal
// values. NaN fails every comparison and never becomes a candidate.
__device__ __forceinline__ void consider(Best& b, float v, int i) {
  if (v == v && (b.index < 0 || v > b.value)) b = Best{v, i};
}

// Across threads the order is lost: equal values resolve to the lower index explicitly.
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.index, o)};
    b = better(b, other);
  }
  return b;
}

// One block per row. Each thread walks the row with a stride of kThreads vectors, kUnroll vectors per
// step (all loads issued before any compare), then the block reduces (value, index) pairs.
// NOTE: 1024 threads x 4 unrolled 16-byte loads keep 64 KiB in flight per SM, enough to stream a
// 128k-vocab bf16 row (256 KiB) from one SM at decode batch sizes without waiting on each load.
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxParams p) {
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int64_t row = blockIdx.x;
  const T* logits = static_cast<const T*>(p.logits) + row * p.logits_stride;
  const int nvec = p.vocab / N;

  Best best{0.f, -1};
  for (int base = threadIdx.x; base < nvec; base += kThreads * kUnroll) {
    alignas(16) T buf[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads;
      if (i < nvec) {
        if constexpr (kVec)
          *reinterpret_cast<V*>(buf[u]) = reinterpret_cast<const V*>(logits)[i];
        else
          buf[u][0] = logits[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads;
      if (i < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) consider(best, to_f32(buf[u][j]), i * N + j);
      }
    }
  }

  __shared__ Best warp_results[kThreads / 32];
  best = warp_best(best);
  if ((threadIdx.x & 31) == 0) warp_results[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = warp_best(warp_results[threadIdx.x]);  // kThreads / 32 == 32 entries, one per lane
    if (threadIdx.x == 0) p.out[row] = best.index < 0 ? 0 : best.index;
  }
}

template <class T>
void launch_argmax(const ArgmaxParams& p, int64_t num_tokens, Stream stream) {
  if (num_tokens == 0) return;
  constexpr int N = Vec16<T>::N;
  const bool vec = p.vocab % N == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                   (p.logits_stride * int64_t(sizeof(T))) % 16 == 0;
  if (vec)
    argmax_kernel<T, true><<<unsigned(num_tokens), kThreads, 0, stream>>>(p);
  else
    argmax_kernel<T, false><<<unsigned(num_tokens), kThreads, 0, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

static_assert(kThreads == 32 * 32, "the second reduction stage gives each lane of one warp one warp's result");

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Tensor Argmax::forward(const Tensor& logits) {
  constexpr const char* op = "argmax";
  check_rank(logits, op, "logits", 2, "[num_tokens, vocab]");
  check_dtype(logits, op, "logits", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(logits, op, "logits");
  KBN_CHECK(logits.size(1) > 0 && logits.size(1) <= (int64_t(1) << 30), op,
            ": argument 'logits' dimension 1 (vocab) must be in [1, 2^30], got ", logits.str());
  Tensor out = Tensor::empty({logits.size(0)}, DType::i64, logits.device());
  if (logits.is_cpu()) {
    reference::argmax(out, logits);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const ArgmaxParams p{.logits = logits.data_ptr(),
                       .out = out.data<int64_t>(),
                       .logits_stride = logits.stride(0),
                       .vocab = int(logits.size(1))};
  dispatch_float16_32(logits.dtype(), op, "logits",
                      [&](auto t) { launch_argmax<decltype(t)>(p, logits.size(0), current_stream()); });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
