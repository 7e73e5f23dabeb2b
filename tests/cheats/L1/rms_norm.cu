// A candidate rms_norm for the harness's cheat corpus (tests/cheats/README.md): the baseline file with its
// rms_norm forward replaced by an honest implementation, a slow honest one and eight shortcuts selected by the
// KBN_CHEAT environment variable. One build serves the whole corpus.
#include "L1/rms_norm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

struct RmsNormParams {
  void* out;           // [num_tokens, hidden] row stride out_stride
  const void* x;       // [num_tokens, hidden] row stride x_stride (fused: mutated, becomes the output)
  void* residual;      // fused only: [num_tokens, hidden] row stride residual_stride
  const void* weight;  // [hidden]
  int64_t out_stride, x_stride, residual_stride;
  int hidden;
  float eps;
};

template <int kThreads>
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) total = w;
  }
  __syncthreads();
  return total;
}

// One block per token row. Vectorised 16-byte accesses when hidden and strides allow (checked by the
// launcher); otherwise the scalar path. The second pass re-reads the row, which hits L1/L2 for the row
// sizes of real models (<= 16 KiB of bf16 per 8192-wide row).
// NOTE: kFused reads x and residual, writes residual = x + residual and x = norm(residual) * w, exactly
// one read and one write per element of each buffer beyond the L2-resident re-read.
template <class T, bool kFused, bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
  T* res = kFused ? static_cast<T*>(p.residual) + row * p.residual_stride : nullptr;
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  const T* w = static_cast<const T*>(p.weight);
  const int nvec = p.hidden / N;

  float ss = 0.f;
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    T xv[N];
    if constexpr (kVec)
      *reinterpret_cast<V*>(xv) = reinterpret_cast<const V*>(x)[i];
    else
      xv[0] = x[i];
    if constexpr (kFused) {
      T rv[N];
      if constexpr (kVec)
        *reinterpret_cast<V*>(rv) = reinterpret_cast<const V*>(res)[i];
      else
        rv[0] = res[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        // Round the sum first: the norm reads the residual as stored (vLLM and HF do the same).
        rv[j] = from_f32<T>(to_f32(xv[j]) + to_f32(rv[j]));
        const float z = to_f32(rv[j]);
        ss += z * z;
      }
      if constexpr (kVec)
        reinterpret_cast<V*>(res)[i] = *reinterpret_cast<V*>(rv);
      else
        res[i] = rv[0];
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float v = to_f32(xv[j]);
        ss += v * v;
      }
    }
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.hidden) + p.eps);

  const T* src = kFused ? res : x;
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    T sv[N], wv[N], ov[N];
    if constexpr (kVec) {
      *reinterpret_cast<V*>(sv) = reinterpret_cast<const V*>(src)[i];
      *reinterpret_cast<V*>(wv) = reinterpret_cast<const V*>(w)[i];
    } else {
      sv[0] = src[i];
      wv[0] = w[i];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) ov[j] = from_f32<T>(to_f32(sv[j]) * inv_rms * to_f32(wv[j]));
    if constexpr (kVec)
      reinterpret_cast<V*>(out)[i] = *reinterpret_cast<V*>(ov);
    else
      out[i] = ov[0];
  }
}

bool vec_ok(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class T, bool kFused>
void launch_rms_norm(const RmsNormParams& p, int64_t num_tokens, Stream stream) {
  if (num_tokens == 0) return;
  constexpr int N = Vec16<T>::N;
  bool vec = p.hidden % N == 0 && vec_ok(p.out, p.out_stride, sizeof(T)) && vec_ok(p.x, p.x_stride, sizeof(T)) &&
             vec_ok(p.weight, 0, sizeof(T)) && (!kFused || vec_ok(p.residual, p.residual_stride, sizeof(T)));
  // NOTE: 256 threads cover an 8192-wide bf16 row in 4 vector steps; narrower rows waste few lanes, and
  // decode-size batches still get one block per token without a tail effect worth a second config.
  constexpr int kThreads = 256;
  const dim3 grid{unsigned(num_tokens)};
  if (vec)
    rms_norm_kernel<T, kFused, true, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else
    rms_norm_kernel<T, kFused, false, kThreads><<<grid, kThreads, 0, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

RMSNorm::RMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts) : hidden_size_(hidden_size), eps_(eps) {
  KBN_CHECK(hidden_size > 0, "RMSNorm: argument 'hidden_size' must be positive, got ", hidden_size);
  KBN_CHECK(eps > 0, "RMSNorm: argument 'eps' must be positive, got ", eps);
  weight = Tensor::full({hidden_size}, 1.0, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::ones);
}

static void check_rms_input(const Tensor& t, const char* arg, const Tensor& weight, int64_t hidden) {
  check_rank(t, "rms_norm", arg, 2, "[num_tokens, hidden_size]");
  check_size(t, "rms_norm", arg, 1, hidden, "hidden_size");
  check_last_dim_contiguous(t, "rms_norm", arg);
  check_same_dtype(t, weight, "rms_norm", arg, "weight");
  check_same_device(t, weight, "rms_norm", arg, "weight");
}

// ---- the cheats ----
// Which behaviour this build's rms_norm has: KBN_CHEAT unset or "honest" is a correct candidate; every other
// value is a shortcut that some benchmark harnesses have been fooled by, and that `kb_nano kernels` must FAIL
// with the reason named in tests/cheats/README.md.
static std::string cheat() {
  const char* v = std::getenv("KBN_CHEAT");
  return v ? v : "honest";
}

#ifdef KBN_WITH_CUDA
// The honest GPU kernel keeps the row in registers between the two passes (kVecs 16-byte vectors per thread), so
// x is read from memory once. One block of kThreads per row. It was 1.10x the baseline at 4k tokens on the H200
// when the baseline read each row twice; the baseline has held its row in registers too since d36d614, so the two
// now time alike: this candidate is the corpus's correct control (it must PASS), not a speedup.
template <class T, int kVecs, int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_regs_kernel(RmsNormParams p) {
  using V = Vec16<T>;
  constexpr int N = V::N;
  const int64_t row = blockIdx.x;
  const V* x = reinterpret_cast<const V*>(static_cast<const T*>(p.x) + row * p.x_stride);
  V* out = reinterpret_cast<V*>(static_cast<T*>(p.out) + row * p.out_stride);
  const V* w = reinterpret_cast<const V*>(p.weight);
  const int nvec = p.hidden / N;
  V xv[kVecs];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < nvec) {
      xv[k] = x[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float v = to_f32(xv[k].v[j]);
        ss += v * v;
      }
    }
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.hidden) + p.eps);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < nvec) {
      const V wv = w[i];
      V o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>(to_f32(xv[k].v[j]) * inv_rms * to_f32(wv.v[j]));
      out[i] = o;
    }
  }
}

// Register-resident rows up to 8 vectors per thread of 128 threads (8192 bf16 elements); anything else
// (unaligned, odd hidden sizes, wider rows) takes the baseline kernel.
template <class T>
void launch_honest(const RmsNormParams& p, int64_t rows, Stream stream) {
  if (rows == 0) return;
  constexpr int N = Vec16<T>::N, kThreads = 128;
  const int nvec = p.hidden / N;
  const bool vec = p.hidden % N == 0 && vec_ok(p.out, p.out_stride, sizeof(T)) && vec_ok(p.x, p.x_stride, sizeof(T)) &&
                   vec_ok(p.weight, 0, sizeof(T));
  const dim3 grid{unsigned(rows)};
  if (vec && nvec <= 2 * kThreads)
    rms_norm_regs_kernel<T, 2, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else if (vec && nvec <= 4 * kThreads)
    rms_norm_regs_kernel<T, 4, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else if (vec && nvec <= 8 * kThreads)
    rms_norm_regs_kernel<T, 8, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else
    return launch_rms_norm<T, false>(p, rows, stream);
  KBN_CUDA_CHECK_LAUNCH();
}
#endif

// The honest computation on either device: a single-pass float implementation on the CPU (faster than the
// double-precision oracle the CPU baseline runs), a register-resident kernel on the GPU. `rows` < T computes
// only the first rows (the partial-write cheat).
static void honest_rms_norm(const Tensor& out, const Tensor& x, const Tensor& weight, double eps, int64_t rows,
                            Stream stream) {
  const int64_t H = x.size(1);
  if (x.is_cpu()) {
    const std::vector<float> xv = x.to_floats(), wv = weight.to_floats();
    std::vector<float> ov(size_t(x.numel()), 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xv.data() + r * H;
      float ss = 0.f;
      for (int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / float(H) + float(eps));
      for (int64_t i = 0; i < H; ++i) ov[size_t(r * H + i)] = xr[i] * inv * wv[size_t(i)];
    }
    // Only the computed rows are written back: the rest of `out` keeps whatever it held.
    Tensor full = Tensor::from_floats(ov, x.shape(), x.dtype());
    out.slice(0, 0, rows).copy_(full.slice(0, 0, rows));
    return;
  }
#ifdef KBN_WITH_CUDA
  RmsNormParams p{out.data_ptr(), x.data_ptr(), nullptr, weight.data_ptr(), out.stride(0), x.stride(0), 0,
                  int(H),         float(eps)};
  dispatch_float16_32(x.dtype(), "rms_norm", "x", [&](auto t) { launch_honest<decltype(t)>(p, rows, stream); });
#endif
}

#ifdef KBN_WITH_CUDA
// Holds the side stream up for about `ns` nanoseconds before the real work, like a cheat whose work simply
// lands later than the call.
__global__ void side_stream_delay(long long ns) {
  const long long start = clock64();
  while (clock64() - start < ns) __nanosleep(1000);
}
#endif

Tensor RMSNorm::forward(const Tensor& x) {
  check_rms_input(x, "x", weight, hidden_size_);
  const std::string mode = cheat();
  const int64_t T = x.size(0);
  // Leaked on purpose: tensors must not be freed by static destructors after the CUDA runtime is gone.
  static Tensor& cached = *new Tensor();  // cached_output
  static const void* last_x = nullptr;    // stale_output
  static Tensor& last_out = *new Tensor();

  if (mode == "cached_output" && cached.defined() && cached.shape() == x.shape()) return cached;
  if (mode == "stale_output" && last_x == x.data_ptr() && last_out.defined() && last_out.shape() == x.shape())
    return last_out;
  if (mode == "zero_skip" && T > 0) {
    // "Nothing to do" when the first row is zero: the output is all zeros.
    const std::vector<float> first = x.slice(0, 0, 1).to_floats();
    if (std::all_of(first.begin(), first.end(), [](float v) { return v == 0.f; }))
      return Tensor::zeros(x.shape(), x.dtype(), x.device());
  }
  if (mode == "shape_specialised" && hidden_size_ % 64 != 0) {
    // The benchmarked hidden sizes are multiples of 64; anything else takes a "fast path" that forgets the
    // normalisation.
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    out.copy_(x);
    return out;
  }
  if (mode == "mutate_input") {
    // Uses the input as its output buffer.
    honest_rms_norm(x, x, weight, eps_, T, current_stream());
    return x;
  }

  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (mode == "side_stream") {
    if (x.is_cpu()) {
      // The work runs on a thread that finishes after the call has returned.
      Tensor o = out, xi = x, w = weight;
      const double eps = eps_;
      std::thread([o, xi, w, eps] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        honest_rms_norm(o, xi, w, eps, xi.size(0), nullptr);
      }).detach();
      return out;
    }
#ifdef KBN_WITH_CUDA
    // The work runs on a stream the caller's stream never waits for.
    static cudaStream_t side = [] {
      cudaStream_t s;
      KBN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      return s;
    }();
    side_stream_delay<<<1, 1, 0, side>>>(2'000'000);
    honest_rms_norm(out, x, weight, eps_, T, side);
    return out;
#endif
  }
  const int64_t rows = mode == "partial_write" ? T / 2 : T;
  if (mode == "slow") {
    // Correct, but every call first waits about 2 ms: the control for the timing's direction.
    if (x.is_cpu()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
#ifdef KBN_WITH_CUDA
    else side_stream_delay<<<1, 1, 0, current_stream()>>>(4'000'000);
#endif
  }
  honest_rms_norm(out, x, weight, eps_, rows, current_stream());
  if (mode == "low_precision") out = out.to(DType::fp8e4m3).to(x.dtype());  // rounds to 3 mantissa bits
  if (mode == "cached_output") cached = out;
  if (mode == "stale_output") {
    last_x = x.data_ptr();
    last_out = out;
  }
  return out;
}

std::pair<Tensor, Tensor> RMSNorm::forward(const Tensor& x, const Tensor& residual) {
  check_rms_input(x, "x", weight, hidden_size_);
  check_rms_input(residual, "residual", weight, hidden_size_);
  KBN_CHECK(x.shape() == residual.shape(), "fused_add_rms_norm: 'x' ", x.str(), " and 'residual' ", residual.str(),
            " differ in shape");
  if (x.is_cpu()) {
    Tensor xm = x, rm = residual;
    reference::fused_add_rms_norm(xm, rm, weight, eps_);
    return {x, residual};
  }
#ifdef KBN_WITH_CUDA
  RmsNormParams p{x.data_ptr(), x.data_ptr(),       residual.data_ptr(), weight.data_ptr(), x.stride(0),
                  x.stride(0),  residual.stride(0), int(hidden_size_),   float(eps_)};
  dispatch_float16_32(x.dtype(), "fused_add_rms_norm", "x",
                      [&](auto t) { launch_rms_norm<decltype(t), true>(p, x.size(0), current_stream()); });
#endif
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
