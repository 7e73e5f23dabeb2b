#pragma once
// The RMS norm kernels (rms_norm, fused_add_rms_norm, and GemmaRMSNorm's (1 + w) through weight_offset), shared by
// L1/rms_norm.cu and L1/gemma_rms_norm.cu. Included under KBN_WITH_CUDA.
#include <cstdint>

#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"

namespace kbn::KBN_VARIANT {
namespace {

// ---- kernel layer: raw pointers, row strides, a stream ----

struct RmsNormParams {
  void* out;           // [rows, hidden] row stride out_stride
  const void* x;       // [num_tokens, heads, hidden]: token stride x_stride, head stride x_head_stride (fused: mutated,
                       // becomes the output; heads = 1)
  void* residual;      // fused only: [num_tokens, hidden] row stride residual_stride
  const void* weight;  // [hidden]
  int64_t out_stride, x_stride, residual_stride;
  int hidden;
  float eps;
  int heads = 1;  // rows per token: row r is head r % heads of token r / heads
  int64_t x_head_stride = 0;
  float weight_offset = 0.f;  // the scale is weight_offset + weight: 0 for RMSNorm, 1 for GemmaRMSNorm
};

// x * inv_rms * scale in fp32, rounded once; the scale is the weight, or weight_offset + weight (computed in fp32,
// as GemmaRMSNorm's (1 + w)).
template <class T>
__device__ __forceinline__ T scaled(const RmsNormParams& p, T x, float inv_rms, T w) {
  const float wf = to_f32(w);
  return from_f32<T>(to_f32(x) * inv_rms * (p.weight_offset != 0.f ? p.weight_offset + wf : wf));
}

__device__ __forceinline__ int64_t x_row_offset(const RmsNormParams& p, int64_t row) {
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

// One block per token row, for rows too wide for rms_norm_regs_kernel or without 16-byte alignment. Vectorised
// 16-byte accesses when hidden and strides allow (checked by the launcher); otherwise the scalar path. The second
// pass re-reads the row, which hits L1/L2 for the row sizes of real models (<= 16 KiB of bf16 per 8192-wide row).
// NOTE: kFused reads x and residual, writes residual = x + residual and x = norm(residual) * w, exactly
// one read and one write per element of each buffer beyond the L2-resident re-read.
template <class T, bool kFused, bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
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
    for (int j = 0; j < N; ++j) ov[j] = scaled(p, sv[j], inv_rms, wv[j]);
    if constexpr (kVec)
      reinterpret_cast<V*>(out)[i] = *reinterpret_cast<V*>(ov);
    else
      out[i] = ov[0];
  }
}

// The row held in registers: every thread loads its kVecs 16-byte vectors of x (and of the residual) at once, so a
// block has the whole row in flight before the reduction, and the normalising pass reads nothing but the weight.
// For rows of up to kThreads * kVecs vectors (the launcher picks the smallest kVecs that covers the row).
// Measured on the H200 against the two-pass kernel below (bench/results/h200/tune_rms_norm_regs.md): rms_norm
// 1.04-1.11x at every size from 1 to 16k tokens (4096 wide: 72.8% of copy bandwidth at 4k tokens, 89.6% at 16k);
// fused_add_rms_norm unchanged (0.99-1.00x).
template <class T, bool kFused, int kThreads, int kVecs>
__global__ void __launch_bounds__(kThreads) rms_norm_regs_kernel(RmsNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  using V = Vec16<T>;
  constexpr int N = V::N;
  const int64_t row = blockIdx.x;
  const V* x = reinterpret_cast<const V*>(static_cast<const T*>(p.x) + x_row_offset(p, row));
  V* res = kFused ? reinterpret_cast<V*>(static_cast<T*>(p.residual) + row * p.residual_stride) : nullptr;
  V* out = reinterpret_cast<V*>(static_cast<T*>(p.out) + row * p.out_stride);
  const V* w = static_cast<const V*>(p.weight);
  const int nvec = p.hidden / N;

  V v[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < nvec) v[k] = x[i];
  }
  if constexpr (kFused) {
    V r[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < nvec) r[k] = res[i];
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) v[k].v[j] = from_f32<T>(to_f32(v[k].v[j]) + to_f32(r[k].v[j]));  // rounded sum
        res[i] = v[k];
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (threadIdx.x + k * kThreads < nvec) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float z = to_f32(v[k].v[j]);
        ss += z * z;
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
      for (int j = 0; j < N; ++j) o.v[j] = scaled(p, v[k].v[j], inv_rms, wv.v[j]);
      out[i] = o;
    }
  }
}

// One warp per row, kWarps rows per block, for rows of at most 32 vectors (per-head norms: head_dim 64..256), where
// a block per row would leave most of its threads idle and launch one block per (token, head).
template <class T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) rms_norm_warp_kernel(RmsNormParams p, int64_t rows) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
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
    for (int j = 0; j < N; ++j) o.v[j] = scaled(p, v.v[j], inv_rms, wv.v[j]);
    out[lane] = o;
  }
}

// fused_add_rms_norm with an fp32 residual stream and f16/bf16 activations (Mamba-2's residual_in_fp32): residual <-
// x + residual in fp32 (no rounding), x <- norm(residual) * w rounded once to T. One block per row, kN elements per
// thread step (4: a 16-byte fp32 vector of the residual, 8 bytes of x); the second pass re-reads the residual row
// from L1/L2.
template <class T, int kN, int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_f32_residual_kernel(RmsNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t row = blockIdx.x;
  T* x = static_cast<T*>(const_cast<void*>(p.x)) + row * p.x_stride;
  float* res = static_cast<float*>(p.residual) + row * p.residual_stride;
  const T* w = static_cast<const T*>(p.weight);
  const int steps = p.hidden / kN;
  float ss = 0.f;
  for (int i = threadIdx.x; i < steps; i += kThreads) {
    float r[kN];
    T xv[kN];
    if constexpr (kN == 4) {
      *reinterpret_cast<float4*>(r) = reinterpret_cast<const float4*>(res)[i];
      *reinterpret_cast<uint2*>(xv) = reinterpret_cast<const uint2*>(x)[i];
    } else {
      r[0] = res[i];
      xv[0] = x[i];
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      r[j] += to_f32(xv[j]);
      ss += r[j] * r[j];
    }
    if constexpr (kN == 4)
      reinterpret_cast<float4*>(res)[i] = *reinterpret_cast<float4*>(r);
    else
      res[i] = r[0];
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.hidden) + p.eps);
  for (int i = threadIdx.x; i < steps; i += kThreads) {
    float r[kN];
    T wv[kN], o[kN];
    if constexpr (kN == 4) {
      *reinterpret_cast<float4*>(r) = reinterpret_cast<const float4*>(res)[i];
      *reinterpret_cast<uint2*>(wv) = reinterpret_cast<const uint2*>(w)[i];
    } else {
      r[0] = res[i];
      wv[0] = w[i];
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) o[j] = from_f32<T>(r[j] * inv_rms * to_f32(wv[j]));
    if constexpr (kN == 4)
      reinterpret_cast<uint2*>(x)[i] = *reinterpret_cast<uint2*>(o);
    else
      x[i] = o[0];
  }
}

// The same for rows of at most kThreads x 4 x kIters values with 16-byte aligned residual rows: every load of the row
// is issued before the first use (the residual and x held in registers), so a decode-size step costs one memory
// round trip and a block reduction rather than a chain of dependent loads per pass. Sums in the order of the
// looped kernel (each thread's elements in index order, then block_sum).
template <class T, int kThreads, int kIters>
__global__ void __launch_bounds__(kThreads) rms_norm_f32_residual_regs_kernel(RmsNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t row = blockIdx.x;
  T* x = static_cast<T*>(const_cast<void*>(p.x)) + row * p.x_stride;
  float* res = static_cast<float*>(p.residual) + row * p.residual_stride;
  const T* w = static_cast<const T*>(p.weight);
  const int steps = p.hidden / 4;
  float r[kIters][4];
  T xv[kIters][4];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    if (i < steps) {
      *reinterpret_cast<float4*>(r[k]) = reinterpret_cast<const float4*>(res)[i];
      *reinterpret_cast<uint2*>(xv[k]) = reinterpret_cast<const uint2*>(x)[i];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    if (i >= steps) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      r[k][j] += to_f32(xv[k][j]);
      ss += r[k][j] * r[k][j];
    }
    reinterpret_cast<float4*>(res)[i] = *reinterpret_cast<float4*>(r[k]);
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(ss) / float(p.hidden) + p.eps);
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    if (i >= steps) continue;
    T wv[4], o[4];
    *reinterpret_cast<uint2*>(wv) = reinterpret_cast<const uint2*>(w)[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = from_f32<T>(r[k][j] * inv_rms * to_f32(wv[j]));
    reinterpret_cast<uint2*>(x)[i] = *reinterpret_cast<uint2*>(o);
  }
}

// T: f16 or bf16 (x, weight); the residual is f32.
template <class T>
void launch_rms_norm_f32_residual(const RmsNormParams& p, int64_t rows, Stream stream) {
  static_assert(sizeof(T) == 2, "the fp32-residual norm takes 16-bit activations");
  if (rows == 0) return;
  constexpr int kThreads = 256;
  const auto aligned = [](const void* q, int64_t stride, size_t es, size_t a) {
    return reinterpret_cast<uintptr_t>(q) % a == 0 && (stride * int64_t(es)) % int64_t(a) == 0;
  };
  const bool vec = p.hidden % 4 == 0 && aligned(p.x, p.x_stride, sizeof(T), 8) && aligned(p.weight, 0, sizeof(T), 8) &&
                   aligned(p.residual, p.residual_stride, 4, 16);
  const int64_t steps = p.hidden / 4;
  if (vec && steps <= kThreads * 2)
    launch_pdl(rms_norm_f32_residual_regs_kernel<T, kThreads, 2>, unsigned(rows), kThreads, 0, stream, p);
  else if (vec && steps <= kThreads * 4)
    launch_pdl(rms_norm_f32_residual_regs_kernel<T, kThreads, 4>, unsigned(rows), kThreads, 0, stream, p);
  else if (vec && steps <= kThreads * 8)
    launch_pdl(rms_norm_f32_residual_regs_kernel<T, kThreads, 8>, unsigned(rows), kThreads, 0, stream, p);
  else if (vec)
    launch_pdl(rms_norm_f32_residual_kernel<T, 4, kThreads>, unsigned(rows), kThreads, 0, stream, p);
  else
    launch_pdl(rms_norm_f32_residual_kernel<T, 1, kThreads>, unsigned(rows), kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

bool vec_ok(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

// `rows`: tokens x heads.
template <class T, bool kFused>
void launch_rms_norm(const RmsNormParams& p, int64_t rows, Stream stream) {
  if (rows == 0) return;
  constexpr int N = Vec16<T>::N;
  bool vec = p.hidden % N == 0 && vec_ok(p.out, p.out_stride, sizeof(T)) && vec_ok(p.x, p.x_stride, sizeof(T)) &&
             vec_ok(p.x, p.x_head_stride, sizeof(T)) && vec_ok(p.weight, 0, sizeof(T)) &&
             (!kFused || vec_ok(p.residual, p.residual_stride, sizeof(T)));
  // NOTE: 256 threads cover an 8192-wide bf16 row in 4 vector steps; narrower rows waste few lanes, and
  // decode-size batches still get one block per token without a tail effect worth a second config.
  constexpr int kThreads = 256;
  const dim3 grid{unsigned(rows)};
  const int nvec = p.hidden / N;
  if constexpr (!kFused) {
    if (vec && nvec <= 32) {
      constexpr int kWarps = 8;
      launch_pdl(rms_norm_warp_kernel<T, kWarps>, unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream, p, rows);
      KBN_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (vec && nvec <= kThreads * 8) {  // rows up to 16384 bf16 / 8192 f32 values: held in registers
    if (nvec <= kThreads)
      launch_pdl(rms_norm_regs_kernel<T, kFused, kThreads, 1>, grid, kThreads, 0, stream, p);
    else if (nvec <= kThreads * 2)
      launch_pdl(rms_norm_regs_kernel<T, kFused, kThreads, 2>, grid, kThreads, 0, stream, p);
    else if (nvec <= kThreads * 4)
      launch_pdl(rms_norm_regs_kernel<T, kFused, kThreads, 4>, grid, kThreads, 0, stream, p);
    else
      launch_pdl(rms_norm_regs_kernel<T, kFused, kThreads, 8>, grid, kThreads, 0, stream, p);
  } else if (vec)
    launch_pdl(rms_norm_kernel<T, kFused, true, kThreads>, grid, kThreads, 0, stream, p);
  else
    launch_pdl(rms_norm_kernel<T, kFused, false, kThreads>, grid, kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace kbn::KBN_VARIANT
