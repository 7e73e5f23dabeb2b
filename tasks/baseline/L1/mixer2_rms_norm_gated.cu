#include "L1/mixer2_rms_norm_gated.h"

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

// ---- kernel layer: raw pointers, row strides in elements, a stream ----

struct GatedNormParams {
  void* out;           // [num_tokens, hidden] contiguous
  const void* x;       // [num_tokens, hidden] row stride x_stride, channels contiguous
  const void* gate;    // [num_tokens, hidden] row stride gate_stride, channels contiguous
  const void* weight;  // [hidden]
  int64_t x_stride, gate_stride;
  int64_t rows;  // num_tokens * n_groups: row r is group r % n_groups of token r / n_groups
  int hidden, group_size, n_groups;
  int lanes;  // threads per row: a power of two <= kNormThreads
  float eps;
};

constexpr int kNormThreads = 128;
constexpr int kMaxVecsPerThread = 8;

__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

// One row (a token's group of group_size channels) per `lanes` threads, kNormThreads / lanes rows per CTA. Each thread
// keeps its kVecs vectors of y = x * silu(gate) in fp32 registers between the two passes: the sum of squares (a
// shuffle reduction over the row's lanes, through shared memory when a row spans several warps), then
// out = y * rsqrt(mean(y^2) + eps) * weight, rounded once. x and gate are read once and out written once.
// NOTE: Mamba-Codestral's groups of 1024 bf16 channels are 128 vectors: one CTA per row, one vector of x and one of
// gate in flight per thread; the tiny test model's 64-channel groups are 8 lanes, 16 rows per CTA.
template <class T, int kN, int kVecs>
__global__ void __launch_bounds__(kNormThreads) mixer2_rms_norm_gated_kernel(GatedNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  __shared__ float warp_sums[kNormThreads / 32];
  const int lane = int(threadIdx.x) & (p.lanes - 1);
  const int64_t row = int64_t(blockIdx.x) * (kNormThreads / p.lanes) + int(threadIdx.x) / p.lanes;
  const bool valid = row < p.rows;
  const int64_t t = row / p.n_groups;
  const int64_t col0 = (row % p.n_groups) * p.group_size;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride + col0;
  const T* gate = static_cast<const T*>(p.gate) + t * p.gate_stride + col0;
  const int nvec = p.group_size / kN;
  float y[kVecs][kN];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = lane + k * p.lanes;
    if (valid && i < nvec) {
      alignas(16) T xv[kN], gv[kN];
      if constexpr (kN > 1) {
        *reinterpret_cast<Vec16<T>*>(xv) = reinterpret_cast<const Vec16<T>*>(x)[i];
        *reinterpret_cast<Vec16<T>*>(gv) = reinterpret_cast<const Vec16<T>*>(gate)[i];
      } else {
        xv[0] = x[i];
        gv[0] = gate[i];
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        y[k][j] = to_f32(xv[j]) * silu(to_f32(gv[j]));
        ss = fmaf(y[k][j], y[k][j], ss);
      }
    }
  }
  const int warp_lanes = p.lanes < 32 ? p.lanes : 32;
  for (int off = warp_lanes >> 1; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (p.lanes > 32) {
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    const int warps = p.lanes / 32, first = (int(threadIdx.x) / p.lanes) * warps;
    ss = 0.f;
    for (int w = 0; w < warps; ++w) ss += warp_sums[first + w];
  }
  const float inv_rms = rsqrtf(ss / float(p.group_size) + p.eps);
  const T* w = static_cast<const T*>(p.weight) + col0;
  T* out = static_cast<T*>(p.out) + t * p.hidden + col0;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = lane + k * p.lanes;
    if (valid && i < nvec) {
      alignas(16) T wv[kN], ov[kN];
      if constexpr (kN > 1)
        *reinterpret_cast<Vec16<T>*>(wv) = reinterpret_cast<const Vec16<T>*>(w)[i];
      else
        wv[0] = w[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) ov[j] = from_f32<T>(y[k][j] * inv_rms * to_f32(wv[j]));
      if constexpr (kN > 1)
        reinterpret_cast<Vec16<T>*>(out)[i] = *reinterpret_cast<const Vec16<T>*>(ov);
      else
        out[i] = ov[0];
    }
  }
}

// Rows wider than kNormThreads * kMaxVecsPerThread vectors (no model has them): one CTA per row, scalar accesses, the
// second pass recomputing y from x and gate (re-read from L2).
template <class T>
__global__ void __launch_bounds__(kNormThreads) mixer2_rms_norm_gated_wide_kernel(GatedNormParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  __shared__ float warp_sums[kNormThreads / 32];
  __shared__ float total;
  const int64_t row = blockIdx.x;
  const int64_t t = row / p.n_groups;
  const int64_t col0 = (row % p.n_groups) * p.group_size;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride + col0;
  const T* gate = static_cast<const T*>(p.gate) + t * p.gate_stride + col0;
  float ss = 0.f;
  for (int i = threadIdx.x; i < p.group_size; i += kNormThreads) {
    const float v = to_f32(x[i]) * silu(to_f32(gate[i]));
    ss = fmaf(v, v, ss);
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < kNormThreads / 32; ++w) s += warp_sums[w];
    total = s;
  }
  __syncthreads();
  const float inv_rms = rsqrtf(total / float(p.group_size) + p.eps);
  const T* w = static_cast<const T*>(p.weight) + col0;
  T* out = static_cast<T*>(p.out) + t * p.hidden + col0;
  for (int i = threadIdx.x; i < p.group_size; i += kNormThreads)
    out[i] = from_f32<T>(to_f32(x[i]) * silu(to_f32(gate[i])) * inv_rms * to_f32(w[i]));
}

template <class T, int kN, int kVecs>
void launch_rows(GatedNormParams p, int nvec, Stream stream) {
  const int per_thread = (nvec + kVecs - 1) / kVecs;
  int lanes = 1;
  while (lanes < per_thread) lanes *= 2;
  p.lanes = lanes;
  const int rows_per_cta = kNormThreads / lanes;
  const int64_t grid = (p.rows + rows_per_cta - 1) / rows_per_cta;
  launch_pdl(mixer2_rms_norm_gated_kernel<T, kN, kVecs>, unsigned(grid), kNormThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

template <class T, int kN>
void launch_mixer2_rms_norm_gated(const GatedNormParams& p, Stream stream) {
  const int nvec = p.group_size / kN;
  if (nvec <= kNormThreads) {
    launch_rows<T, kN, 1>(p, nvec, stream);
  } else if (nvec <= kNormThreads * kMaxVecsPerThread) {
    launch_rows<T, kN, kMaxVecsPerThread>(p, nvec, stream);
  } else {
    launch_pdl(mixer2_rms_norm_gated_wide_kernel<T>, unsigned(p.rows), kNormThreads, 0, stream, p);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

bool aligned16(const void* p, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Mixer2RMSNormGated::Mixer2RMSNormGated(int64_t hidden_size, int64_t n_groups, double eps, const ParamOptions& opts)
    : hidden_size_(hidden_size), n_groups_(n_groups), eps_(eps) {
  KBN_CHECK(hidden_size > 0 && hidden_size <= std::numeric_limits<int>::max(),
            "Mixer2RMSNormGated: argument 'hidden_size' must be positive and fit 32 bits, got ", hidden_size);
  KBN_CHECK(n_groups > 0 && hidden_size % n_groups == 0,
            "Mixer2RMSNormGated: argument 'n_groups' must divide "
            "hidden_size (",
            hidden_size, "), got ", n_groups);
  KBN_CHECK(eps > 0, "Mixer2RMSNormGated: argument 'eps' must be positive, got ", eps);
  weight = Tensor::full({hidden_size}, 1.0, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::ones);
}

Tensor Mixer2RMSNormGated::forward(const Tensor& x, const Tensor& gate) {
  constexpr const char* op = "mixer2_rms_norm_gated";
  check_rank(x, op, "x", 2, "[num_tokens, hidden_size]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_size(x, op, "x", 1, hidden_size_, "hidden_size");
  check_last_dim_contiguous(x, op, "x");
  check_rank(gate, op, "gate", 2, "[num_tokens, hidden_size]");
  check_size(gate, op, "gate", 0, x.size(0), "num_tokens");
  check_size(gate, op, "gate", 1, hidden_size_, "hidden_size");
  check_same_dtype(x, gate, op, "x", "gate");
  check_last_dim_contiguous(gate, op, "gate");
  check_same_device(x, gate, op, "x", "gate");
  check_same_dtype(x, weight, op, "x", "weight");
  check_same_device(x, weight, op, "x", "weight");
  const int64_t num_tokens = x.size(0);
  Tensor out = Tensor::empty({num_tokens, hidden_size_}, x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::rms_norm_gated(out, x, gate, weight, group_size(), eps_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (num_tokens == 0) return out;
  const GatedNormParams p{.out = out.data_ptr(),
                          .x = x.data_ptr(),
                          .gate = gate.data_ptr(),
                          .weight = weight.data_ptr(),
                          .x_stride = x.stride(0),
                          .gate_stride = gate.stride(0),
                          .rows = num_tokens * n_groups_,
                          .hidden = int(hidden_size_),
                          .group_size = int(group_size()),
                          .n_groups = int(n_groups_),
                          .lanes = 1,
                          .eps = float(eps_)};
  KBN_CHECK(p.rows < (int64_t(1) << 31), op, ": argument 'x' has too many rows (", num_tokens, " tokens x ", n_groups_,
            " groups) for the kernel's grid");
  const size_t es = x.element_size();
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
    using T = decltype(t);
    constexpr int kN = Vec16<T>::N;
    // The vector and scalar paths reduce in different orders, so the result must not depend on how x and gate happen
    // to be laid out: when only their alignment stands in the way, they are copied and the vector path runs.
    const bool vec_shape = p.group_size % kN == 0 && aligned16(p.weight, 0, es) && aligned16(p.out, 0, es);
    GatedNormParams q = p;
    Tensor xc, gc;
    if (vec_shape && !(aligned16(q.x, q.x_stride, es) && aligned16(q.gate, q.gate_stride, es))) {
      xc = x.contiguous();
      gc = gate.contiguous();
      q.x = xc.data_ptr();
      q.gate = gc.data_ptr();
      q.x_stride = xc.stride(0);
      q.gate_stride = gc.stride(0);
    }
    if (vec_shape)
      launch_mixer2_rms_norm_gated<T, kN>(q, current_stream());
    else
      launch_mixer2_rms_norm_gated<T, 1>(q, current_stream());
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
