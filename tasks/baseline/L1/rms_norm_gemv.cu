#include "L1/rms_norm_gemv.h"

#include <cstdint>

#include "kbn/checks.h"
#include "kbn/forward_context.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/gemv.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device_errors.h"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

namespace {
// RMSNormGatedGemv reproduces Mixer2RMSNormGated's kernel, whose sum order depends on its block size.
constexpr int kGatedNormCtaThreads = 128;  // = mixer2_rms_norm_gated.cu's kNormThreads
}  // namespace

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----
//
// One block of kThreads per kWarps warps, each streaming two weight rows (two outputs, or one output's gate and up
// rows). Every block first normalises the whole row itself (the row is a few KiB, read from L2 after the first block;
// recomputing it in every block costs no launch and no synchronisation across blocks) into shared memory, then each
// warp streams its weight rows as linear's GEMV does (the first kLoadsInFlight vectors of every lane issued before
// the dependent-launch wait, under the kernel before) and takes the dot products with the staged row. Block 0 also
// writes h = x + residual.
//
// Bits: the norm's sum of squares runs in the order of rms_norm's block kernels (thread t adds the elements of
// vectors t, t + kThreads, ... in index order; then the warps' xor-shuffle sums and the sum of the kWarps warp sums
// in one warp), which is why the block has exactly their kThreads; each output's dot product in the order of
// linear's GEMV (lane l adds vectors l, l + 32, ... in index order, then the warp's xor-shuffle sum). With an fp32
// residual (Mamba-2's residual_in_fp32) the sum h stays fp32 and the norm reads it unrounded, in the order of
// rms_norm's fp32-residual kernels: thread t adds the 4-element groups t, t + kThreads, ... in index order.
constexpr int kThreads = 256;  // = rms_norm's block size: the sum order depends on it
constexpr int kWarps = kThreads / 32;
constexpr int kLoadsInFlight = 8;

struct NormGemvParams {
  void* out;                // [1, n_out]
  const void* x;            // [1, hidden]
  const void* residual;     // [1, hidden] or null: x's dtype, or f32 (kResidual == Residual::f32)
  void* residual_out;       // [1, hidden] (h, the residual's dtype) when residual is given
  void* normed_out;         // [1, hidden] (the normalised row, x's dtype) or null: RMSNormGemv::forward_normed
  const void* norm_weight;  // [hidden]
  const void* weight;       // [n_out, hidden], or [2 n_out, hidden] (gate rows then up rows) with an activation
  const void* bias;         // [n_out] / [2 n_out] or null
  int hidden, n_out;
  float eps, weight_offset;
  bool stage_h;  // fp32 residual: h kept in shared memory after the row (else re-read and re-added in the second pass)
  // RMSNormGemvConv1d: output columns [conv_begin, conv_begin + conv_dim) go through causal_conv1d_update.
  void* conv_states = nullptr;            // [num_slots, conv_width - 1, conv_dim]
  const void* conv_weight = nullptr;      // [conv_dim, conv_width]
  const void* conv_bias = nullptr;        // [conv_dim] or null
  const int32_t* conv_indices = nullptr;  // [1]: the token's slot
  int conv_begin = 0, conv_dim = 0, conv_width = 0, conv_num_slots = 0;
  bool conv_silu = false;
  DeviceErrorRecord* error = nullptr;
  int32_t slot_code = 0;
  // RMSNormGatedGemv: x is the gated norm's input, gate its gate, norm_weight its weight; groups of group_size
  // channels, group_lanes threads each (Mixer2RMSNormGated's lanes: the power of two >= its vectors).
  const void* gate = nullptr;  // [1, hidden]
  int group_size = 0, n_groups = 0, group_lanes = 0;
};

constexpr int kMaxConvWidth = 4;

// One channel's causal_conv1d_update step, held by lane 0 of the warp computing its column: the window (the slot's
// kMaxConvWidth - 1 earlier inputs, oldest first), the taps and the bias, loaded before the dependent-launch wait.
template <class T>
struct ConvChannel {
  bool live = false;  // the column is in the conv's segment and the slot is a real one
  int64_t c = 0;      // the channel
  T hist[kMaxConvWidth - 1], w[kMaxConvWidth], bias;

  __device__ __forceinline__ void load(const NormGemvParams& p, int column, int slot) {
    c = column - p.conv_begin;
    live = c >= 0 && c < p.conv_dim && slot >= 0 && slot < p.conv_num_slots;
    if (!live) return;
    const T* state = static_cast<const T*>(p.conv_states) + int64_t(slot) * (p.conv_width - 1) * p.conv_dim + c;
    const T* taps = static_cast<const T*>(p.conv_weight) + c * p.conv_width;
#pragma unroll
    for (int k = 0; k < kMaxConvWidth; ++k) {
      if (k < p.conv_width - 1) hist[k] = state[int64_t(k) * p.conv_dim];
      if (k < p.conv_width) w[k] = taps[k];
    }
    bias = p.conv_bias != nullptr ? static_cast<const T*>(p.conv_bias)[c] : from_f32<T>(0.f);
  }

  // ConvTaps::apply's arithmetic (L1/causal_conv1d.cuh) on the new input y, rounded to T; then the window shifts
  // into the state as causal_conv1d_update's does.
  __device__ __forceinline__ T step(const NormGemvParams& p, int slot, T y) const {
    float acc = to_f32(bias);
#pragma unroll
    for (int k = 0; k < kMaxConvWidth - 1; ++k)
      if (k < p.conv_width - 1) acc = fmaf(to_f32(w[k]), to_f32(hist[k]), acc);
    acc = fmaf(to_f32(w[p.conv_width - 1]), to_f32(y), acc);
    const float out = p.conv_silu ? acc / (1.f + expf(-acc)) : acc;
    T* state = static_cast<T*>(p.conv_states) + int64_t(slot) * (p.conv_width - 1) * p.conv_dim + c;
#pragma unroll
    for (int k = 0; k < kMaxConvWidth - 1; ++k)
      if (k < p.conv_width - 1) state[int64_t(k) * p.conv_dim] = k + 1 < p.conv_width - 1 ? hist[k + 1] : y;
    return from_f32<T>(out);
  }
};

// silu_and_mul's and gelu_and_mul's ("tanh") fp32 expressions (tasks/baseline/L1/silu_and_mul.cu, gelu_and_mul.cu):
// the same bits on the rounded gate and up.
__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }
__device__ __forceinline__ float gelu_tanh_mul(float g, float up) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  return 0.5f * g * (1.f + tanhf(kBeta * (g + kKappa * g * g * g))) * up;
}

// Mixer2RMSNormGated's silu (tasks/baseline/L1/mixer2_rms_norm_gated.cu): the same expression, the same bits.
__device__ __forceinline__ float gated_norm_silu(float v) { return v / (1.f + expf(-v)); }

// The sum of v over the block in rms_norm's order (each warp's xor-shuffle sum, then the warp sums in one warp).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kWarps];
  __shared__ float total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < kWarps ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) total = w;
  }
  __syncthreads();
  return total;
}

// The residual add before the norm: none (the first layer), in x's dtype (the sum rounded to it), or an fp32 stream.
enum class Residual : int { none, same, f32 };

// Outputs per warp: one with an activation (its gate and up rows), else two (adjacent rows): two weight rows streamed
// per warp either way, so that the row's norm, which every block recomputes, is amortised over twice the rows of a
// one-row-per-warp launch (half the blocks).
template <NormGemvAct kAct>
constexpr int outs_per_warp() {
  return kAct == NormGemvAct::none ? 2 : 1;
}

// kConv (RMSNormGemvConv1d, no activation): the outputs in the conv's segment go through its update (ConvChannel);
// the slot (step metadata, written before the step's first kernel) and the channels' windows are read before the
// dependent-launch wait: the caller's contract is that no kernel of the step writes those state rows before this one.
// kGatedNorm (RMSNormGatedGemv, no residual, no activation): the staged row is Mixer2RMSNormGated's output.
template <class T, Residual kResidual, NormGemvAct kAct, bool kConv = false, bool kGatedNorm = false>
__global__ void __launch_bounds__(kThreads) rms_norm_gemv_kernel(NormGemvParams p) {
  constexpr bool kGated = kAct != NormGemvAct::none;
  static_assert(!kConv || !kGated, "the conv epilogue goes with the plain linear");
  static_assert(!kGatedNorm || (!kGated && !kConv && kResidual == Residual::none),
                "the gated norm goes with the plain linear, without a residual");
  extern __shared__ uint4 staged[];  // the normalised row, 16-byte vectors (then h in fp32 when p.stage_h)
  using V = Vec16<T>;
  constexpr int N = V::N;
  constexpr int R = 2;  // weight rows per warp: gate and up of one output, or two outputs
  const int lane = int(threadIdx.x % 32);
  const int warp = int(blockIdx.x) * kWarps + int(threadIdx.x / 32);
  const int o = warp * outs_per_warp<kAct>();  // the warp's (first) output
  const bool active = o < p.n_out;
  const bool second = !kGated && o + 1 < p.n_out;  // the second output of a two-output warp exists
  const int kv = p.hidden / N;
  const uint4* w[R];
  // Row of weight row r: gate o and up o + n_out, or rows o and o + 1 (o again for a missing second output: its loads
  // stay in bounds and its sum is dropped).
  w[0] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.weight) + int64_t(o) * p.hidden);
  w[1] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.weight) +
                                        (kGated ? int64_t(o) + p.n_out : int64_t(second ? o + 1 : o)) * p.hidden);

  // The weights are parameters no kernel of the step writes: the first loads go out before the wait.
  uint4 wv[R][kLoadsInFlight];
  const bool first_chunk = active && lane + 32 * (kLoadsInFlight - 1) < kv;
  if (first_chunk) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_weight(w[r] + lane + 32 * u);
  }
  [[maybe_unused]] int slot = 0;
  [[maybe_unused]] ConvChannel<T> conv[R];
  if constexpr (kConv) {
    if (active && lane == 0) {
      slot = p.conv_indices[0];
      conv[0].load(p, o, slot);
      if (second) conv[1].load(p, o + 1, slot);
    }
  }
  pdl_wait();

  // h = x (+ residual, rounded), its sum of squares, then the row normalised and rounded, staged for every warp.
  V* sv = reinterpret_cast<V*>(staged);
  float ss = 0.f;
  if constexpr (kGatedNorm) {
    // Mixer2RMSNormGated's arithmetic in its order (mixer2_rms_norm_gated_kernel, one vector per thread): the block
    // runs as kThreads / kGatedNormCtaThreads of its CTAs at a time, CTA c taking the groups from
    // c * (kGatedNormCtaThreads / lanes), group_lanes threads each; each thread's fmaf sum of y^2 over its vector,
    // the xor shuffles over the group's lanes of a warp, then (a group over several warps) the warp sums in order.
    // Each group's inverse rms goes to shared memory after the row; the second pass recomputes y (the same bits).
    __shared__ float cta_warp_sums[kWarps];
    float* inv_rms = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(staged) + size_t(p.hidden) * sizeof(T));
    const V* xr = static_cast<const V*>(p.x);
    const V* gr = static_cast<const V*>(p.gate);
    const int nvec = p.group_size / N, lanes = p.group_lanes, groups_per_cta = kGatedNormCtaThreads / lanes;
    const int ctas = (p.n_groups + groups_per_cta - 1) / groups_per_cta;
    const int lane_g = int(threadIdx.x) % lanes;
    for (int c0 = 0; c0 < ctas; c0 += kThreads / kGatedNormCtaThreads) {
      const int g = (c0 + int(threadIdx.x) / kGatedNormCtaThreads) * groups_per_cta +
                    (int(threadIdx.x) % kGatedNormCtaThreads) / lanes;
      float s = 0.f;
      if (g < p.n_groups && lane_g < nvec) {
        const V xv = xr[g * nvec + lane_g], gv = gr[g * nvec + lane_g];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float y = to_f32(xv.v[j]) * gated_norm_silu(to_f32(gv.v[j]));
          s = fmaf(y, y, s);
        }
      }
      const int warp_lanes = lanes < 32 ? lanes : 32;
      for (int off = warp_lanes >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lanes > 32) {
        if ((threadIdx.x & 31) == 0) cta_warp_sums[threadIdx.x >> 5] = s;
        __syncthreads();
        const int warps = lanes / 32, first = (int(threadIdx.x) / lanes) * warps;
        s = 0.f;
        for (int w = 0; w < warps; ++w) s += cta_warp_sums[first + w];
        __syncthreads();  // every warp has read its sums before the next round writes them
      }
      if (lane_g == 0 && g < p.n_groups) inv_rms[g] = rsqrtf(s / float(p.group_size) + p.eps);
    }
    __syncthreads();
    const V* nw = static_cast<const V*>(p.norm_weight);
    for (int i = int(threadIdx.x); i < kv; i += kThreads) {
      const V xv = xr[i], gv = gr[i], wn = nw[i];
      const float inv = inv_rms[i / nvec];
      V y;
#pragma unroll
      for (int j = 0; j < N; ++j)
        y.v[j] = from_f32<T>(to_f32(xv.v[j]) * gated_norm_silu(to_f32(gv.v[j])) * inv * to_f32(wn.v[j]));
      sv[i] = y;
    }
  } else if constexpr (kResidual == Residual::f32) {
    // rms_norm_f32_residual's arithmetic: h = residual + x in fp32, the sum of squares of h, then h * inv_rms * w
    // rounded once. The second pass recomputes h from the same inputs (the same bits) rather than staging it.
    static_assert(sizeof(T) == 2, "the fp32 residual stream goes with 16-bit activations");
    const float4* r4 = static_cast<const float4*>(p.residual);
    const uint2* x4 = static_cast<const uint2*>(p.x);
    float4* h4 = static_cast<float4*>(p.residual_out);
    const int groups = p.hidden / 4;
    const auto sum_at = [&](int i) {
      float4 r = r4[i];
      const uint2 xv = x4[i];
      const T* xe = reinterpret_cast<const T*>(&xv);
      r.x += to_f32(xe[0]);
      r.y += to_f32(xe[1]);
      r.z += to_f32(xe[2]);
      r.w += to_f32(xe[3]);
      return r;
    };
    // h in fp32 after the staged row (16-byte aligned: hidden * sizeof(T) is a multiple of 16).
    float4* hs = reinterpret_cast<float4*>(reinterpret_cast<unsigned char*>(staged) + size_t(p.hidden) * sizeof(T));
    for (int i = int(threadIdx.x); i < groups; i += kThreads) {
      const float4 r = sum_at(i);
      ss += r.x * r.x;
      ss += r.y * r.y;
      ss += r.z * r.z;
      ss += r.w * r.w;
      if (blockIdx.x == 0) h4[i] = r;
      if (p.stage_h) hs[i] = r;
    }
    const float inv_rms = rsqrtf(block_sum(ss) / float(p.hidden) + p.eps);
    const uint2* nw = static_cast<const uint2*>(p.norm_weight);
    uint2* s4 = reinterpret_cast<uint2*>(staged);
    for (int i = int(threadIdx.x); i < groups; i += kThreads) {
      const float4 r = p.stage_h ? hs[i] : sum_at(i);
      const uint2 wv = nw[i];
      const T* we = reinterpret_cast<const T*>(&wv);
      uint2 o;
      T* oe = reinterpret_cast<T*>(&o);
      oe[0] = from_f32<T>(r.x * inv_rms * to_f32(we[0]));
      oe[1] = from_f32<T>(r.y * inv_rms * to_f32(we[1]));
      oe[2] = from_f32<T>(r.z * inv_rms * to_f32(we[2]));
      oe[3] = from_f32<T>(r.w * inv_rms * to_f32(we[3]));
      s4[i] = o;
    }
  } else {
    const V* xr = static_cast<const V*>(p.x);
    const V* rr = static_cast<const V*>(p.residual);
    V* hv = static_cast<V*>(p.residual_out);
    for (int i = int(threadIdx.x); i < kv; i += kThreads) {
      V v = xr[i];
      if constexpr (kResidual == Residual::same) {
        const V r = rr[i];
#pragma unroll
        for (int j = 0; j < N; ++j) v.v[j] = from_f32<T>(to_f32(v.v[j]) + to_f32(r.v[j]));  // rounded sum
        if (blockIdx.x == 0) hv[i] = v;
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float z = to_f32(v.v[j]);
        ss += z * z;
      }
      sv[i] = v;
    }
    const float inv_rms = rsqrtf(block_sum(ss) / float(p.hidden) + p.eps);
    const V* nw = static_cast<const V*>(p.norm_weight);
    for (int i = int(threadIdx.x); i < kv; i += kThreads) {
      const V v = sv[i], wn = nw[i];
      V y;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float wf = to_f32(wn.v[j]);
        y.v[j] = from_f32<T>(to_f32(v.v[j]) * inv_rms * (p.weight_offset != 0.f ? p.weight_offset + wf : wf));
      }
      sv[i] = y;
    }
  }
  __syncthreads();
  if (p.normed_out != nullptr && blockIdx.x == 0) {  // forward_normed: the staged row, written once
    V* yo = static_cast<V*>(p.normed_out);
    for (int i = int(threadIdx.x); i < kv; i += kThreads) yo[i] = sv[i];
  }
  if (!active) return;

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  int i = lane;
  if (first_chunk) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot16<T>(wv[r][u], staged[i + 32 * u], acc[r]);
    i += 32 * kLoadsInFlight;
  }
  for (; i + 32 * (kLoadsInFlight - 1) < kv; i += 32 * kLoadsInFlight) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_weight(w[r] + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot16<T>(wv[r][u], staged[i + 32 * u], acc[r]);
  }
  for (; i < kv; i += 32)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = dot16<T>(load_weight(w[r] + i), staged[i], acc[r]);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (lane != 0) return;
  const T* bias = static_cast<const T*>(p.bias);
  // linear's epilogue (the bias, or + 0, then one rounding), then the activation's on the rounded halves.
  const T y0 = from_f32<T>(acc[0] + (bias != nullptr ? to_f32(bias[o]) : 0.f));
  if constexpr (kGated) {
    const T y1 = from_f32<T>(acc[1] + (bias != nullptr ? to_f32(bias[o + p.n_out]) : 0.f));
    const float a =
        kAct == NormGemvAct::silu_and_mul ? silu_mul(to_f32(y0), to_f32(y1)) : gelu_tanh_mul(to_f32(y0), to_f32(y1));
    static_cast<T*>(p.out)[o] = from_f32<T>(a);
  } else if constexpr (kConv) {
    // A column of the conv's segment: its update's output (zero for a padding row; nothing for a bad slot, which is
    // reported once, by the segment's first channel, as causal_conv1d_update reports it).
    const T y1 = from_f32<T>(acc[1] + (bias != nullptr ? to_f32(bias[second ? o + 1 : o]) : 0.f));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r == 1 && !second) break;
      const int col = o + r;
      const T y = r == 0 ? y0 : y1;
      const bool in_segment = col >= p.conv_begin && col < p.conv_begin + p.conv_dim;
      if (!in_segment) {
        static_cast<T*>(p.out)[col] = y;
      } else if (conv[r].live) {
        static_cast<T*>(p.out)[col] = conv[r].step(p, slot, y);
      } else if (slot == kPadStateSlot) {
        static_cast<T*>(p.out)[col] = from_f32<T>(0.f);
      } else if (col == p.conv_begin) {
        volatile DeviceErrorRecord* e = p.error;
        e->detail = 0;
        e->code = p.slot_code;
      }
    }
  } else {
    static_cast<T*>(p.out)[o] = y0;
    if (second) static_cast<T*>(p.out)[o + 1] = from_f32<T>(acc[1] + (bias != nullptr ? to_f32(bias[o + 1]) : 0.f));
  }
}

template <class T, Residual kResidual>
void launch_rms_norm_gemv(const NormGemvParams& p, NormGemvAct act, Stream stream, bool conv = false) {
  const auto grid = [&](int outs) { return unsigned((p.n_out + kWarps * outs - 1) / (kWarps * outs)); };
  const size_t smem = size_t(p.hidden) * sizeof(T) + (p.stage_h ? size_t(p.hidden) * 4 : 0);
  if (conv) {
    launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::none, true>, grid(outs_per_warp<NormGemvAct::none>()),
               kThreads, smem, stream, p);
    KBN_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (act) {
    case NormGemvAct::none:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::none>, grid(outs_per_warp<NormGemvAct::none>()),
                 kThreads, smem, stream, p);
      break;
    case NormGemvAct::silu_and_mul:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::silu_and_mul>, grid(1), kThreads, smem, stream, p);
      break;
    case NormGemvAct::gelu_tanh_and_mul:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::gelu_tanh_and_mul>, grid(1), kThreads, smem, stream,
                 p);
      break;
  }
  KBN_CUDA_CHECK_LAUNCH();
}

// RMSNormGatedGemv: the staged row, then each group's inverse rms.
template <class T>
void launch_rms_norm_gated_gemv(const NormGemvParams& p, Stream stream) {
  constexpr int outs = outs_per_warp<NormGemvAct::none>();
  const unsigned grid = unsigned((p.n_out + kWarps * outs - 1) / (kWarps * outs));
  const size_t smem = size_t(p.hidden) * sizeof(T) + size_t(p.n_groups) * 4;
  launch_pdl(rms_norm_gemv_kernel<T, Residual::none, NormGemvAct::none, false, true>, grid, kThreads, smem, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

namespace {
// The staged row, under the 48 KiB a block gets without opting in (block_sum takes a few bytes more); 16384 bf16.
constexpr int64_t kMaxStagedBytes = 40 * 1024;
}  // namespace

RMSNormGemv::RMSNormGemv(double eps, double weight_offset, NormGemvAct act)
    : eps_(eps), weight_offset_(weight_offset), act_(act) {
  KBN_CHECK(eps > 0, "rms_norm_gemv: argument 'eps' must be positive, got ", eps);
  KBN_CHECK(weight_offset == 0.0 || weight_offset == 1.0,
            "rms_norm_gemv: argument 'weight_offset' must be 0 (RMSNorm) or 1 (GemmaRMSNorm), got ", weight_offset);
  KBN_CHECK(act == NormGemvAct::none || act == NormGemvAct::silu_and_mul || act == NormGemvAct::gelu_tanh_and_mul,
            "rms_norm_gemv: argument 'act' must be none (0), silu_and_mul (1) or gelu_tanh_and_mul (2), got ",
            int(act));
}

bool RMSNormGemv::kernel_supports(DType dtype, int64_t num_tokens, int64_t hidden) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  const int64_t es = int64_t(dtype_size(dtype));
  return num_tokens == 1 && hidden > 0 && hidden % (16 / es) == 0 && hidden * es <= kMaxStagedBytes;
}

bool RMSNormGemv::applies(const Tensor& x) {
  return x.defined() && x.dim() == 2 && x.size(0) == 1 && (x.is_cpu() || kernel_supports(x.dtype(), 1, x.size(1)));
}

namespace {

// The conv epilogue's arguments (RMSNormGemvConv1d), checked.
struct ConvArgs {
  const Tensor* states;
  const Tensor* weight;
  const Tensor* bias;
  const Tensor* indices;
  int64_t begin, dim, width;
  bool silu;
};

// RMSNormGemv::forward and RMSNormGemvConv1d::forward: the checks, the oracle composition on CPU, the launch.
// The arguments both ops share beside x [T, K]: the norm's weight [K], the linear's weight [n, K] and its bias [n] (or
// undefined), checked by name. Returns n.
int64_t check_norm_and_linear(const char* op, const Tensor& x, int64_t K, const Tensor& norm_weight,
                              const Tensor& weight, const Tensor& bias) {
  check_rank(norm_weight, op, "norm_weight", 1, "[hidden]");
  check_size(norm_weight, op, "norm_weight", 0, K, "hidden");
  check_same_dtype(x, norm_weight, op, "x", "norm_weight");
  check_same_device(x, norm_weight, op, "x", "norm_weight");
  check_contiguous(norm_weight, op, "norm_weight");
  check_rank(weight, op, "weight", 2, "[out_features, hidden]");
  check_size(weight, op, "weight", 1, K, "hidden");
  check_same_dtype(x, weight, op, "x", "weight");
  check_same_device(x, weight, op, "x", "weight");
  check_contiguous(weight, op, "weight");
  const int64_t n = weight.size(0);
  KBN_CHECK(n <= INT32_MAX && K <= INT32_MAX, op, ": argument 'weight' is too large, got ", weight.str());
  if (bias.defined()) {
    check_rank(bias, op, "bias", 1, "[out_features]");
    check_size(bias, op, "bias", 0, n, "out_features");
    check_same_dtype(x, bias, op, "x", "bias");
    check_same_device(x, bias, op, "x", "bias");
    check_contiguous(bias, op, "bias");
  }
  return n;
}

// normed: where forward_normed wants the normalised row (null otherwise).
std::pair<Tensor, Tensor> norm_gemv(const char* op, const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                    const Tensor& weight, const Tensor& bias, double eps, double weight_offset,
                                    NormGemvAct act, const ConvArgs* conv, Tensor* normed = nullptr) {
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  const int64_t T = x.size(0), K = x.size(1);
  KBN_CHECK(K > 0, op, ": argument 'x' must have hidden > 0, got ", x.str());
  // An fp32 residual stream with 16-bit x (Mamba-2's residual_in_fp32) is allowed, as RMSNorm allows it; h is then f32.
  const bool f32_residual = residual.defined() && residual.dtype() == DType::f32 && x.dtype() != DType::f32;
  if (f32_residual) {
    KBN_CHECK(weight_offset == 0.0, op, ": an fp32 'residual' with ", dtype_name(x.dtype()),
              " 'x' goes with RMSNorm (weight_offset 0), got weight_offset ", weight_offset);
  } else if (residual.defined()) {
    check_same_dtype(x, residual, op, "x", "residual");
  }
  if (residual.defined()) {
    check_same_device(x, residual, op, "x", "residual");
    KBN_CHECK(residual.shape() == x.shape(), op, ": argument 'residual' ", residual.str(), " must have x's shape ",
              x.str());
    check_last_dim_contiguous(residual, op, "residual");
  }
  const int64_t n = check_norm_and_linear(op, x, K, norm_weight, weight, bias);
  const bool gated = act != NormGemvAct::none;
  KBN_CHECK(!gated || n % 2 == 0, op, ": argument 'weight' must have an even out_features (gate rows then up rows) ",
            "with an activation, got ", weight.str());
  if (conv != nullptr)
    KBN_CHECK(conv->begin + conv->dim <= n, op, ": the conv's segment [conv_begin = ", conv->begin,
              ", + dim = ", conv->dim, ") must lie within the out_features of argument 'weight' ", weight.str());
  const int64_t n_out = gated ? n / 2 : n;
  Tensor out = Tensor::empty({T, n_out}, x.dtype(), x.device());
  Tensor h = residual.defined() ? Tensor::empty({T, K}, residual.dtype(), x.device()) : Tensor();
  if (normed != nullptr) *normed = Tensor::empty({T, K}, x.dtype(), x.device());
  if (T == 0) return {out, h};
  if (x.is_cpu()) {
    // The oracle: the norm (fused add on copies, as vLLM's in-place op would leave them), linear, the activation.
    const bool gemma = weight_offset != 0.0;
    Tensor y = normed != nullptr ? *normed : Tensor::empty({T, K}, x.dtype(), x.device());
    if (residual.defined()) {
      y.copy_(x);
      h.copy_(residual);
      gemma ? reference::gemma_fused_add_rms_norm(y, h, norm_weight, eps)
            : reference::fused_add_rms_norm(y, h, norm_weight, eps);
    } else {
      gemma ? reference::gemma_rms_norm(y, x, norm_weight, eps) : reference::rms_norm(y, x, norm_weight, eps);
    }
    if (gated) {
      Tensor gate_up = Tensor::empty({T, n}, x.dtype(), x.device());
      reference::linear(gate_up, y, weight, bias);
      if (act == NormGemvAct::silu_and_mul)
        reference::silu_and_mul(out, gate_up);
      else
        reference::gelu_and_mul(out, gate_up, "tanh");
    } else {
      reference::linear(out, y, weight, bias);
    }
    if (conv != nullptr) {
      // Then the conv update's oracle over the segment, written back into it.
      check_distinct_slots(*conv->indices, op, "conv_state_indices", conv->states->size(0));
      const Tensor seg = out.slice(1, conv->begin, conv->begin + conv->dim).contiguous();
      Tensor conv_out = Tensor::empty(seg.shape(), x.dtype(), x.device());
      Tensor states = *conv->states;
      reference::causal_conv1d_update(conv_out, seg, states, *conv->weight, *conv->bias, *conv->indices, conv->silu);
      out.slice(1, conv->begin, conv->begin + conv->dim).copy_(conv_out);
    }
    return {out, h};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(RMSNormGemv::kernel_supports(x.dtype(), T, K), op, ": argument 'x' ", x.str(),
            ": the kernel takes one token of f32, f16 or bf16, hidden a multiple of 16 bytes and at most ",
            kMaxStagedBytes, " bytes");
  KBN_CHECK(aligned16(x.data_ptr()) && (!residual.defined() || aligned16(residual.data_ptr())) &&
                aligned16(norm_weight.data_ptr()) && aligned16(weight.data_ptr()),
            op, ": arguments 'x', 'residual', 'norm_weight' and 'weight' must start on 16-byte boundaries, got x ",
            x.str());
  NormGemvParams p{.out = out.data_ptr(),
                   .x = x.data_ptr(),
                   .residual = residual.defined() ? residual.data_ptr() : nullptr,
                   .residual_out = h.defined() ? h.data_ptr() : nullptr,
                   .normed_out = normed != nullptr ? normed->data_ptr() : nullptr,
                   .norm_weight = norm_weight.data_ptr(),
                   .weight = weight.data_ptr(),
                   .bias = bias.defined() ? bias.data_ptr() : nullptr,
                   .hidden = int(K),
                   .n_out = int(n_out),
                   .eps = float(eps),
                   .weight_offset = float(weight_offset),
                   // The fp32 sum staged beside the row when both fit the budget (one pass over the inputs).
                   .stage_h = f32_residual && K * (int64_t(x.element_size()) + 4) <= kMaxStagedBytes};
  if (conv != nullptr) {
    KBN_CHECK(conv->states->size(0) <= INT32_MAX && conv->dim <= INT32_MAX, op, ": argument 'conv_states' ",
              conv->states->str(), " is too large for 32-bit indices");
    static const int32_t slot_code = device_error_code(
        "rms_norm_gemv_conv1d: argument 'conv_state_indices'[0] is not a slot of 'conv_states' (indices must lie in "
        "[0, num_slots)); the conv's outputs and state were not written");
    p.conv_states = conv->states->data_ptr();
    p.conv_weight = conv->weight->data_ptr();
    p.conv_bias = conv->bias->defined() ? conv->bias->data_ptr() : nullptr;
    p.conv_indices = conv->indices->data<int32_t>();
    p.conv_begin = int(conv->begin);
    p.conv_dim = int(conv->dim);
    p.conv_width = int(conv->width);
    p.conv_num_slots = int(conv->states->size(0));
    p.conv_silu = conv->silu;
    p.error = device_error_record();
    p.slot_code = slot_code;
  }
  const bool with_conv = conv != nullptr;
  if (f32_residual) {
    dispatch_float16(x.dtype(), op, "x", [&](auto t) {
      launch_rms_norm_gemv<decltype(t), Residual::f32>(p, act, current_stream(), with_conv);
    });
  } else {
    dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
      if (residual.defined())
        launch_rms_norm_gemv<decltype(t), Residual::same>(p, act, current_stream(), with_conv);
      else
        launch_rms_norm_gemv<decltype(t), Residual::none>(p, act, current_stream(), with_conv);
    });
  }
#endif
  return {out, h};
}

}  // namespace

std::pair<Tensor, Tensor> RMSNormGemv::forward(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                               const Tensor& weight, const Tensor& bias) {
  return norm_gemv("rms_norm_gemv", x, residual, norm_weight, weight, bias, eps_, weight_offset_, act_, nullptr);
}

std::tuple<Tensor, Tensor, Tensor> RMSNormGemv::forward_normed(const Tensor& x, const Tensor& residual,
                                                               const Tensor& norm_weight, const Tensor& weight,
                                                               const Tensor& bias) {
  Tensor y;
  auto [out, h] =
      norm_gemv("rms_norm_gemv", x, residual, norm_weight, weight, bias, eps_, weight_offset_, act_, nullptr, &y);
  return {out, h, y};
}

RMSNormGemvConv1d::RMSNormGemvConv1d(double eps, int64_t conv_begin, const std::string& activation)
    : eps_(eps), conv_begin_(conv_begin), silu_(activation == "silu") {
  KBN_CHECK(eps > 0, "rms_norm_gemv_conv1d: argument 'eps' must be positive, got ", eps);
  KBN_CHECK(conv_begin >= 0, "rms_norm_gemv_conv1d: argument 'conv_begin' must be >= 0, got ", conv_begin);
  KBN_CHECK(activation == "silu" || activation.empty(),
            "rms_norm_gemv_conv1d: argument 'activation' must be \"silu\" or \"\" (none), got \"", activation, "\"");
}

bool RMSNormGemvConv1d::kernel_supports(DType dtype, int64_t num_tokens, int64_t hidden, int64_t width) {
  return RMSNormGemv::kernel_supports(dtype, num_tokens, hidden) && width >= 2 && width <= 4;
}

std::pair<Tensor, Tensor> RMSNormGemvConv1d::forward(const Tensor& x, const Tensor& residual,
                                                     const Tensor& norm_weight, const Tensor& weight,
                                                     const Tensor& bias, const Tensor& conv_states,
                                                     const Tensor& conv_weight, const Tensor& conv_bias,
                                                     const Tensor& conv_state_indices) {
  constexpr const char* op = "rms_norm_gemv_conv1d";
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  check_rank(conv_weight, op, "conv_weight", 2, "[dim, width]");
  const int64_t dim = conv_weight.size(0), width = conv_weight.size(1);
  KBN_CHECK(width >= 2 && width <= 4, op, ": argument 'conv_weight' has width ", width,
            "; supported: 2, 3, 4 (vLLM's causal_conv1d range)");
  check_same_dtype(x, conv_weight, op, "x", "conv_weight");
  check_contiguous(conv_weight, op, "conv_weight");
  check_same_device(x, conv_weight, op, "x", "conv_weight");
  if (conv_bias.defined()) {
    check_rank(conv_bias, op, "conv_bias", 1, "[dim]");
    check_size(conv_bias, op, "conv_bias", 0, dim, "dim");
    check_same_dtype(x, conv_bias, op, "x", "conv_bias");
    check_contiguous(conv_bias, op, "conv_bias");
    check_same_device(x, conv_bias, op, "x", "conv_bias");
  }
  check_rank(conv_states, op, "conv_states", 3, "[num_slots, width - 1, dim]");
  check_size(conv_states, op, "conv_states", 1, width - 1, "width - 1");
  check_size(conv_states, op, "conv_states", 2, dim, "dim");
  check_same_dtype(x, conv_states, op, "x", "conv_states");
  check_contiguous(conv_states, op, "conv_states");
  check_same_device(x, conv_states, op, "x", "conv_states");
  check_rank(conv_state_indices, op, "conv_state_indices", 1, "[num_tokens]");
  check_size(conv_state_indices, op, "conv_state_indices", 0, x.size(0), "num_tokens");
  check_dtype(conv_state_indices, op, "conv_state_indices", {DType::i32});
  check_contiguous(conv_state_indices, op, "conv_state_indices");
  check_same_device(x, conv_state_indices, op, "x", "conv_state_indices");
  const ConvArgs conv{.states = &conv_states,
                      .weight = &conv_weight,
                      .bias = &conv_bias,
                      .indices = &conv_state_indices,
                      .begin = conv_begin_,
                      .dim = dim,
                      .width = width,
                      .silu = silu_};
  return norm_gemv(op, x, residual, norm_weight, weight, bias, eps_, 0.0, NormGemvAct::none, &conv);
}

// ---- RMSNormGatedGemv ----

namespace {
// Mixer2RMSNormGated's lanes per group (mixer2_rms_norm_gated.cu: the power of two >= the group's vectors, one vector
// per thread up to its 128-thread block) for groups of nvec 16-byte vectors; 0 where its kernel takes more than one
// vector per thread (a sum order the fused kernel does not reproduce).
int gated_norm_lanes(int64_t nvec) {
  if (nvec < 1 || nvec > kGatedNormCtaThreads) return 0;
  int lanes = 1;
  while (lanes < nvec) lanes *= 2;
  return lanes;
}
}  // namespace

RMSNormGatedGemv::RMSNormGatedGemv(int64_t group_size, double eps) : group_size_(group_size), eps_(eps) {
  KBN_CHECK(group_size > 0 && group_size <= INT32_MAX,
            "rms_norm_gated_gemv: argument 'group_size' must be positive and fit 32 bits, got ", group_size);
  KBN_CHECK(eps > 0, "rms_norm_gated_gemv: argument 'eps' must be positive, got ", eps);
}

bool RMSNormGatedGemv::kernel_supports(DType dtype, int64_t num_tokens, int64_t hidden, int64_t group_size) {
  if (!RMSNormGemv::kernel_supports(dtype, num_tokens, hidden)) return false;
  const int64_t es = int64_t(dtype_size(dtype)), n = 16 / es;
  if (group_size <= 0 || hidden % group_size != 0 || group_size % n != 0) return false;
  return gated_norm_lanes(group_size / n) > 0 && hidden * es + (hidden / group_size) * 4 <= kMaxStagedBytes;
}

bool RMSNormGatedGemv::applies(const Tensor& x, int64_t group_size) {
  return x.defined() && x.dim() == 2 && x.size(0) == 1 &&
         (x.is_cpu() || kernel_supports(x.dtype(), 1, x.size(1), group_size));
}

Tensor RMSNormGatedGemv::forward(const Tensor& x, const Tensor& gate, const Tensor& norm_weight, const Tensor& weight,
                                 const Tensor& bias) {
  constexpr const char* op = "rms_norm_gated_gemv";
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  const int64_t T = x.size(0), K = x.size(1);
  KBN_CHECK(K > 0 && K % group_size_ == 0, op, ": argument 'x' must have hidden a positive multiple of group_size (",
            group_size_, "), got ", x.str());
  check_rank(gate, op, "gate", 2, "[num_tokens, hidden]");
  KBN_CHECK(gate.shape() == x.shape(), op, ": argument 'gate' ", gate.str(), " must have x's shape ", x.str());
  check_same_dtype(x, gate, op, "x", "gate");
  check_same_device(x, gate, op, "x", "gate");
  check_last_dim_contiguous(gate, op, "gate");
  const int64_t n = check_norm_and_linear(op, x, K, norm_weight, weight, bias);
  Tensor out = Tensor::empty({T, n}, x.dtype(), x.device());
  if (T == 0) return out;
  if (x.is_cpu()) {
    // The oracle: the gated norm, then linear.
    Tensor y = Tensor::empty({T, K}, x.dtype(), x.device());
    reference::rms_norm_gated(y, x, gate, norm_weight, group_size_, eps_);
    reference::linear(out, y, weight, bias);
    return out;
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(kernel_supports(x.dtype(), T, K, group_size_), op, ": arguments 'x' ", x.str(), " and 'group_size' ",
            group_size_, ": the kernel takes one token of f32, f16 or bf16, groups of whole 16-byte vectors, at most ",
            kGatedNormCtaThreads, " of them, and the row with its groups' sums within ", kMaxStagedBytes, " bytes");
  KBN_CHECK(aligned16(x.data_ptr()) && aligned16(gate.data_ptr()) && aligned16(norm_weight.data_ptr()) &&
                aligned16(weight.data_ptr()),
            op, ": arguments 'x', 'gate', 'norm_weight' and 'weight' must start on 16-byte boundaries, got x ", x.str(),
            ", gate ", gate.str());
  const int64_t nvec = group_size_ / (16 / int64_t(x.element_size()));
  NormGemvParams p{.out = out.data_ptr(),
                   .x = x.data_ptr(),
                   .residual = nullptr,
                   .residual_out = nullptr,
                   .normed_out = nullptr,
                   .norm_weight = norm_weight.data_ptr(),
                   .weight = weight.data_ptr(),
                   .bias = bias.defined() ? bias.data_ptr() : nullptr,
                   .hidden = int(K),
                   .n_out = int(n),
                   .eps = float(eps_),
                   .weight_offset = 0.f,
                   .stage_h = false};
  p.gate = gate.data_ptr();
  p.group_size = int(group_size_);
  p.n_groups = int(K / group_size_);
  p.group_lanes = gated_norm_lanes(nvec);
  dispatch_float16_32(x.dtype(), op, "x",
                      [&](auto t) { launch_rms_norm_gated_gemv<decltype(t)>(p, current_stream()); });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
