#include "L1/rms_norm_gemv.h"

#include <cstdint>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/gemv.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----
//
// One block of kThreads per kWarps outputs. Every block first normalises the whole row itself (the row is a few KiB,
// read from L2 after the first block; recomputing it in every block costs no launch and no synchronisation across
// blocks) into shared memory, then each warp streams its output's weight row(s) as linear's GEMV does (the first
// kLoadsInFlight vectors of every lane issued before the dependent-launch wait, under the kernel before) and takes
// the dot products with the staged row. Block 0 also writes h = x + residual.
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
};

// silu_and_mul's and gelu_and_mul's ("tanh") fp32 expressions (tasks/baseline/L1/silu_and_mul.cu, gelu_and_mul.cu):
// the same bits on the rounded gate and up.
__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }
__device__ __forceinline__ float gelu_tanh_mul(float g, float up) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  return 0.5f * g * (1.f + tanhf(kBeta * (g + kKappa * g * g * g))) * up;
}

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

template <class T, Residual kResidual, NormGemvAct kAct>
__global__ void __launch_bounds__(kThreads) rms_norm_gemv_kernel(NormGemvParams p) {
  constexpr bool kGated = kAct != NormGemvAct::none;
  extern __shared__ uint4 staged[];  // the normalised row, 16-byte vectors
  using V = Vec16<T>;
  constexpr int N = V::N;
  constexpr int R = kGated ? 2 : 1;  // weight rows per output: gate and up with an activation
  const int lane = int(threadIdx.x % 32);
  const int o = int(blockIdx.x) * kWarps + int(threadIdx.x / 32);
  const bool active = o < p.n_out;
  const int kv = p.hidden / N;
  const uint4* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    w[r] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.weight) +
                                          (int64_t(o) + r * int64_t(p.n_out)) * p.hidden);

  // The weights are parameters no kernel of the step writes: the first loads go out before the wait.
  uint4 wv[R][kLoadsInFlight];
  const bool first_chunk = active && lane + 32 * (kLoadsInFlight - 1) < kv;
  if (first_chunk) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_weight(w[r] + lane + 32 * u);
  }
  pdl_wait();

  // h = x (+ residual, rounded), its sum of squares, then the row normalised and rounded, staged for every warp.
  V* sv = reinterpret_cast<V*>(staged);
  float ss = 0.f;
  if constexpr (kResidual == Residual::f32) {
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
    for (int i = int(threadIdx.x); i < groups; i += kThreads) {
      const float4 r = sum_at(i);
      ss += r.x * r.x;
      ss += r.y * r.y;
      ss += r.z * r.z;
      ss += r.w * r.w;
      if (blockIdx.x == 0) h4[i] = r;
    }
    const float inv_rms = rsqrtf(block_sum(ss) / float(p.hidden) + p.eps);
    const uint2* nw = static_cast<const uint2*>(p.norm_weight);
    uint2* s4 = reinterpret_cast<uint2*>(staged);
    for (int i = int(threadIdx.x); i < groups; i += kThreads) {
      const float4 r = sum_at(i);
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
    const T y1 = from_f32<T>(acc[R - 1] + (bias != nullptr ? to_f32(bias[o + p.n_out]) : 0.f));
    const float a =
        kAct == NormGemvAct::silu_and_mul ? silu_mul(to_f32(y0), to_f32(y1)) : gelu_tanh_mul(to_f32(y0), to_f32(y1));
    static_cast<T*>(p.out)[o] = from_f32<T>(a);
  } else {
    static_cast<T*>(p.out)[o] = y0;
  }
}

template <class T, Residual kResidual>
void launch_rms_norm_gemv(const NormGemvParams& p, NormGemvAct act, Stream stream) {
  const unsigned grid = unsigned((p.n_out + kWarps - 1) / kWarps);
  const size_t smem = size_t(p.hidden) * sizeof(T);
  switch (act) {
    case NormGemvAct::none:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::none>, grid, kThreads, smem, stream, p);
      break;
    case NormGemvAct::silu_and_mul:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::silu_and_mul>, grid, kThreads, smem, stream, p);
      break;
    case NormGemvAct::gelu_tanh_and_mul:
      launch_pdl(rms_norm_gemv_kernel<T, kResidual, NormGemvAct::gelu_tanh_and_mul>, grid, kThreads, smem, stream, p);
      break;
  }
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

std::pair<Tensor, Tensor> RMSNormGemv::forward(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                               const Tensor& weight, const Tensor& bias) {
  return run(x, residual, norm_weight, weight, bias, nullptr);
}

std::tuple<Tensor, Tensor, Tensor> RMSNormGemv::forward_normed(const Tensor& x, const Tensor& residual,
                                                               const Tensor& norm_weight, const Tensor& weight,
                                                               const Tensor& bias) {
  Tensor y;
  auto [out, h] = run(x, residual, norm_weight, weight, bias, &y);
  return {out, h, y};
}

std::pair<Tensor, Tensor> RMSNormGemv::run(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                           const Tensor& weight, const Tensor& bias, Tensor* normed) {
  constexpr const char* op = "rms_norm_gemv";
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  const int64_t T = x.size(0), K = x.size(1);
  KBN_CHECK(K > 0, op, ": argument 'x' must have hidden > 0, got ", x.str());
  // An fp32 residual stream with 16-bit x (Mamba-2's residual_in_fp32) is allowed, as RMSNorm allows it; h is then f32.
  const bool f32_residual = residual.defined() && residual.dtype() == DType::f32 && x.dtype() != DType::f32;
  if (f32_residual) {
    KBN_CHECK(weight_offset_ == 0.0, op, ": an fp32 'residual' with ", dtype_name(x.dtype()),
              " 'x' goes with RMSNorm (weight_offset 0), got weight_offset ", weight_offset_);
  } else if (residual.defined()) {
    check_same_dtype(x, residual, op, "x", "residual");
  }
  if (residual.defined()) {
    check_same_device(x, residual, op, "x", "residual");
    KBN_CHECK(residual.shape() == x.shape(), op, ": argument 'residual' ", residual.str(), " must have x's shape ",
              x.str());
    check_last_dim_contiguous(residual, op, "residual");
  }
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
  const bool gated = act_ != NormGemvAct::none;
  KBN_CHECK(!gated || n % 2 == 0, op, ": argument 'weight' must have an even out_features (gate rows then up rows) ",
            "with an activation, got ", weight.str());
  KBN_CHECK(n <= INT32_MAX && K <= INT32_MAX, op, ": argument 'weight' is too large, got ", weight.str());
  if (bias.defined()) {
    check_rank(bias, op, "bias", 1, "[out_features]");
    check_size(bias, op, "bias", 0, n, "out_features");
    check_same_dtype(x, bias, op, "x", "bias");
    check_same_device(x, bias, op, "x", "bias");
    check_contiguous(bias, op, "bias");
  }
  const int64_t n_out = gated ? n / 2 : n;
  Tensor out = Tensor::empty({T, n_out}, x.dtype(), x.device());
  Tensor h = residual.defined() ? Tensor::empty({T, K}, residual.dtype(), x.device()) : Tensor();
  if (normed != nullptr) *normed = Tensor::empty({T, K}, x.dtype(), x.device());
  if (T == 0) return {out, h};
  if (x.is_cpu()) {
    // The oracle: the norm (fused add on copies, as vLLM's in-place op would leave them), linear, the activation.
    const bool gemma = weight_offset_ != 0.0;
    Tensor y = normed != nullptr ? *normed : Tensor::empty({T, K}, x.dtype(), x.device());
    if (residual.defined()) {
      y.copy_(x);
      h.copy_(residual);
      gemma ? reference::gemma_fused_add_rms_norm(y, h, norm_weight, eps_)
            : reference::fused_add_rms_norm(y, h, norm_weight, eps_);
    } else {
      gemma ? reference::gemma_rms_norm(y, x, norm_weight, eps_) : reference::rms_norm(y, x, norm_weight, eps_);
    }
    if (gated) {
      Tensor gate_up = Tensor::empty({T, n}, x.dtype(), x.device());
      reference::linear(gate_up, y, weight, bias);
      if (act_ == NormGemvAct::silu_and_mul)
        reference::silu_and_mul(out, gate_up);
      else
        reference::gelu_and_mul(out, gate_up, "tanh");
    } else {
      reference::linear(out, y, weight, bias);
    }
    return {out, h};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(kernel_supports(x.dtype(), T, K), op, ": argument 'x' ", x.str(),
            ": the kernel takes one token of f32, f16 or bf16, hidden a multiple of 16 bytes and at most ",
            kMaxStagedBytes, " bytes");
  KBN_CHECK(aligned16(x.data_ptr()) && (!residual.defined() || aligned16(residual.data_ptr())) &&
                aligned16(norm_weight.data_ptr()) && aligned16(weight.data_ptr()),
            op, ": arguments 'x', 'residual', 'norm_weight' and 'weight' must start on 16-byte boundaries, got x ",
            x.str());
  const NormGemvParams p{.out = out.data_ptr(),
                         .x = x.data_ptr(),
                         .residual = residual.defined() ? residual.data_ptr() : nullptr,
                         .residual_out = h.defined() ? h.data_ptr() : nullptr,
                         .normed_out = normed != nullptr ? normed->data_ptr() : nullptr,
                         .norm_weight = norm_weight.data_ptr(),
                         .weight = weight.data_ptr(),
                         .bias = bias.defined() ? bias.data_ptr() : nullptr,
                         .hidden = int(K),
                         .n_out = int(n_out),
                         .eps = float(eps_),
                         .weight_offset = float(weight_offset_)};
  if (f32_residual) {
    dispatch_float16(x.dtype(), op, "x",
                     [&](auto t) { launch_rms_norm_gemv<decltype(t), Residual::f32>(p, act_, current_stream()); });
  } else {
    dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
      if (residual.defined())
        launch_rms_norm_gemv<decltype(t), Residual::same>(p, act_, current_stream());
      else
        launch_rms_norm_gemv<decltype(t), Residual::none>(p, act_, current_stream());
    });
  }
#endif
  return {out, h};
}

}  // namespace kbn::KBN_VARIANT
