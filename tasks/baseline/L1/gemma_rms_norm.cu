#include "L1/gemma_rms_norm.h"

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

// ---- kernel layer: raw pointers, row strides, a stream ----

struct GemmaRmsNormParams {
  void* out;           // [rows, hidden] row stride out_stride
  const void* x;       // [num_tokens, heads, hidden]: token stride x_stride, head stride x_head_stride (fused: mutated,
                       // becomes the output; heads = 1)
  void* residual;      // fused only: [num_tokens, hidden] row stride residual_stride
  const void* weight;  // [hidden]: the scale is 1 + weight
  int64_t out_stride, x_stride, residual_stride;
  int hidden;
  float eps;
  int heads = 1;  // rows per token: row r is head r % heads of token r / heads
  int64_t x_head_stride = 0;
};

__device__ __forceinline__ int64_t x_row_offset(const GemmaRmsNormParams& p, int64_t row) {
  return p.heads == 1 ? row * p.x_stride : (row / p.heads) * p.x_stride + (row % p.heads) * p.x_head_stride;
}

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

// x * inv_rms * (1 + w) in fp32, one rounding (vLLM GemmaRMSNorm: (x * (1 + w)).to(dtype), not x.to(dtype) * w).
template <class T>
__device__ __forceinline__ T gemma_scale(T x, float inv_rms, T w) {
  return from_f32<T>(to_f32(x) * inv_rms * (1.f + to_f32(w)));
}

// One block per row: the first pass sums squares (fused: writes residual = x + residual, rounded, and sums the
// rounded values as vLLM does), the second re-reads the row (L1/L2-resident for real rows: 7.5 KiB of bf16 at
// Gemma-3-12B's 3840) and writes the scaled output. 16-byte vectors when the launcher allows.
template <class T, bool kFused, bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads) gemma_rms_norm_kernel(GemmaRmsNormParams p) {
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + x_row_offset(p, row);
  T* res = kFused ? static_cast<T*>(p.residual) + row * p.residual_stride : nullptr;
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  const T* w = static_cast<const T*>(p.weight);
  const int nvec = p.hidden / N;

  float ss = 0.f;
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    alignas(16) T xv[N];
    if constexpr (kVec)
      *reinterpret_cast<V*>(xv) = reinterpret_cast<const V*>(x)[i];
    else
      xv[0] = x[i];
    if constexpr (kFused) {
      alignas(16) T rv[N];
      if constexpr (kVec)
        *reinterpret_cast<V*>(rv) = reinterpret_cast<const V*>(res)[i];
      else
        rv[0] = res[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        xv[j] = from_f32<T>(to_f32(xv[j]) + to_f32(rv[j]));
        const float z = to_f32(xv[j]);
        ss += z * z;
      }
      if constexpr (kVec)
        reinterpret_cast<V*>(res)[i] = *reinterpret_cast<const V*>(xv);
      else
        res[i] = xv[0];
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float z = to_f32(xv[j]);
        ss += z * z;
      }
    }
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.hidden) + p.eps);

  const T* src = kFused ? res : x;
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    alignas(16) T sv[N], wv[N], ov[N];
    if constexpr (kVec) {
      *reinterpret_cast<V*>(sv) = reinterpret_cast<const V*>(src)[i];
      *reinterpret_cast<V*>(wv) = reinterpret_cast<const V*>(w)[i];
    } else {
      sv[0] = src[i];
      wv[0] = w[i];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) ov[j] = gemma_scale(sv[j], inv_rms, wv[j]);
    if constexpr (kVec)
      reinterpret_cast<V*>(out)[i] = *reinterpret_cast<const V*>(ov);
    else
      out[i] = ov[0];
  }
}

// One warp per row, kWarps rows per block, for rows of at most 32 vectors: Gemma-3's per-head q/k norms (head_dim
// 256 is 32 bf16 vectors), where a block per (token, head) would leave most threads idle.
template <class T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) gemma_rms_norm_warp_kernel(GemmaRmsNormParams p, int64_t rows) {
  using V = Vec16<T>;
  constexpr int N = V::N;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const V* x = reinterpret_cast<const V*>(static_cast<const T*>(p.x) + x_row_offset(p, row));
  V* out = reinterpret_cast<V*>(static_cast<T*>(p.out) + row * p.out_stride);
  const int nvec = p.hidden / N;
  V v;
  float ss = 0.f;
  if (lane < nvec) {
    v = x[lane];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float z = to_f32(v.v[j]);
      ss += z * z;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv_rms = rsqrtf(ss / float(p.hidden) + p.eps);
  if (lane < nvec) {
    const V wv = static_cast<const V*>(p.weight)[lane];
    V o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = gemma_scale(v.v[j], inv_rms, wv.v[j]);
    out[lane] = o;
  }
}

bool vec_ok(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

// `rows`: tokens x heads.
template <class T, bool kFused>
void launch_gemma_rms_norm(const GemmaRmsNormParams& p, int64_t rows, Stream stream) {
  if (rows == 0) return;
  constexpr int N = Vec16<T>::N;
  const bool vec = p.hidden % N == 0 && vec_ok(p.out, p.out_stride, sizeof(T)) && vec_ok(p.x, p.x_stride, sizeof(T)) &&
                   vec_ok(p.x, p.x_head_stride, sizeof(T)) && vec_ok(p.weight, 0, sizeof(T)) &&
                   (!kFused || vec_ok(p.residual, p.residual_stride, sizeof(T)));
  if constexpr (!kFused) {
    if (vec && p.hidden / N <= 32) {
      constexpr int kWarps = 8;
      gemma_rms_norm_warp_kernel<T, kWarps>
          <<<unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(p, rows);
      KBN_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  // NOTE: 256 threads cover a 3840-wide bf16 row (480 vectors) in two steps and a 2880-wide one in two.
  constexpr int kThreads = 256;
  const dim3 grid{unsigned(rows)};
  if (vec)
    gemma_rms_norm_kernel<T, kFused, true, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else
    gemma_rms_norm_kernel<T, kFused, false, kThreads><<<grid, kThreads, 0, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

GemmaRMSNorm::GemmaRMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts)
    : hidden_size_(hidden_size), eps_(eps) {
  KBN_CHECK(hidden_size > 0, "GemmaRMSNorm: argument 'hidden_size' must be positive, got ", hidden_size);
  KBN_CHECK(hidden_size <= std::numeric_limits<int>::max(), "GemmaRMSNorm: argument 'hidden_size' is too large, got ",
            hidden_size);
  KBN_CHECK(eps > 0, "GemmaRMSNorm: argument 'eps' must be positive, got ", eps);
  weight = Tensor::zeros({hidden_size}, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::zeros);
}

static void check_gemma_input(const Tensor& t, const char* op, const char* arg, const Tensor& weight, int64_t hidden,
                              bool heads_ok) {
  if (heads_ok)
    KBN_CHECK(t.dim() == 2 || t.dim() == 3, op, ": argument '", arg,
              "' must be [num_tokens, hidden_size] or [num_tokens, heads, hidden_size], got ", t.str());
  else
    check_rank(t, op, arg, 2, "[num_tokens, hidden_size]");
  check_dtype(t, op, arg, {DType::f32, DType::f16, DType::bf16});
  check_size(t, op, arg, t.dim() - 1, hidden, "hidden_size");
  check_last_dim_contiguous(t, op, arg);
  check_same_dtype(t, weight, op, arg, "weight");
  check_same_device(t, weight, op, arg, "weight");
}

Tensor GemmaRMSNorm::forward(const Tensor& x) {
  constexpr const char* op = "gemma_rms_norm";
  check_gemma_input(x, op, "x", weight, hidden_size_, true);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::gemma_rms_norm(out, x, weight, eps_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const bool heads = x.dim() == 3;
  KBN_CHECK(!heads || x.size(1) <= std::numeric_limits<int>::max(), op, ": argument 'x' has too many heads, got ",
            x.str());
  GemmaRmsNormParams p{.out = out.data_ptr(),
                       .x = x.data_ptr(),
                       .residual = nullptr,
                       .weight = weight.data_ptr(),
                       .out_stride = hidden_size_,
                       .x_stride = x.stride(0),
                       .residual_stride = 0,
                       .hidden = int(hidden_size_),
                       .eps = float(eps_)};
  if (heads) {
    p.heads = int(x.size(1));
    p.x_head_stride = x.stride(1);
  }
  const int64_t rows = x.numel() / hidden_size_;
  dispatch_float16_32(x.dtype(), op, "x",
                      [&](auto t) { launch_gemma_rms_norm<decltype(t), false>(p, rows, current_stream()); });
#endif
  return out;
}

std::pair<Tensor, Tensor> GemmaRMSNorm::forward(const Tensor& x, const Tensor& residual) {
  constexpr const char* op = "gemma_fused_add_rms_norm";
  check_gemma_input(x, op, "x", weight, hidden_size_, false);
  check_gemma_input(residual, op, "residual", weight, hidden_size_, false);
  KBN_CHECK(x.shape() == residual.shape(), op, ": 'x' ", x.str(), " and 'residual' ", residual.str(),
            " differ in shape");
  if (x.is_cpu()) {
    Tensor xm = x, rm = residual;
    reference::gemma_fused_add_rms_norm(xm, rm, weight, eps_);
    return {x, residual};
  }
#ifdef KBN_WITH_CUDA
  const GemmaRmsNormParams p{.out = x.data_ptr(),
                             .x = x.data_ptr(),
                             .residual = residual.data_ptr(),
                             .weight = weight.data_ptr(),
                             .out_stride = x.stride(0),
                             .x_stride = x.stride(0),
                             .residual_stride = residual.stride(0),
                             .hidden = int(hidden_size_),
                             .eps = float(eps_)};  // heads = 1
  dispatch_float16_32(x.dtype(), op, "x",
                      [&](auto t) { launch_gemma_rms_norm<decltype(t), true>(p, x.size(0), current_stream()); });
#endif
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
