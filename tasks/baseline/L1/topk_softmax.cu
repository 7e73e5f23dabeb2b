#include "L1/topk_softmax.h"

#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "kbn/device_errors.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: one warp per token ----
//
// Lane l holds logits l, l + 32, ... of its token (kPerLane of them: the smallest of 1, 2, 4, 8, 16 covering the
// experts, so up to 32 * kMaxPerLane). The softmax's max and sum are warp reductions; the top k are k rounds of a warp
// arg-max over the logits not yet taken, ranked as the header says (a number beats NaN; a larger logit wins; equal
// logits: the lower expert). A row holding a NaN records the error for the host (kbn/device_errors.h) and is still
// ranked. One warp runs k serial rounds, each scanning its lane's kPerLane logits: sizing kPerLane to the experts (4 for
// Qwen3-MoE's 128, 1 for Mixtral's 8) instead of the largest supported 16 is what keeps a one-token call short (the
// 16-wide scan measured 8.45 us a call at 128 experts in a graph on an H100); the order of every sum is unchanged.
constexpr int kWarps = 4;
constexpr int kMaxPerLane = 16;  // 512 experts

struct TopkParams {
  float* weights;   // [num_tokens, top_k]
  int32_t* ids;     // [num_tokens, top_k]
  const void* x;    // [num_tokens, num_experts], row stride x_stride
  int64_t x_stride;
  int64_t num_tokens;
  int num_experts, top_k;
  bool renormalize;
  DeviceErrorRecord* error;  // where a NaN logit is reported (host-mapped)
  int32_t nan_code;
};

// True when candidate (v, i) ranks before (bv, bi).
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
  const bool n = !isnan(v), bn = !isnan(bv);
  if (n != bn) return n;
  if (n && v != bv) return v > bv;
  return i < bi;
}

template <class T, int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) topk_softmax_kernel(TopkParams p) {
  pdl_wait();  // the router's logits come from the kernel before (kbn/pdl.cuh)
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= p.num_tokens) return;
  const T* row = static_cast<const T*>(p.x) + t * p.x_stride;
  float v[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.num_experts ? to_f32(row[e]) : NAN;
    if (e < p.num_experts) mx = fmaxf(mx, v[j]);
  }
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) nan |= lane + 32 * j < p.num_experts && isnan(v[j]);
  if (__any_sync(0xffffffffu, nan) && lane == 0) {
    volatile DeviceErrorRecord* r = p.error;
    r->detail = t;
    r->code = p.nan_code;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < p.num_experts) sum += expf(v[j] - mx);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);

  uint32_t taken = 0;  // bit j: this lane's logit j is chosen already
  float chosen_sum = 0.f, mine = 0.f;
  int my_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float bv = NAN;
    int bi = INT32_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < p.num_experts && !(taken >> j & 1u) && ranks_before(v[j], e, bv, bi)) {
        bv = v[j];
        bi = e;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (ranks_before(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (bi % 32 == lane) taken |= 1u << (bi / 32);
    const float prob = expf(bv - mx) / sum;
    chosen_sum += prob;
    if (lane == k) {  // lane k writes slot k (top_k <= 32)
      mine = prob;
      my_id = bi;
    }
  }
  if (lane < p.top_k) {
    p.weights[t * p.top_k + lane] = p.renormalize ? mine / chosen_sum : mine;
    p.ids[t * p.top_k + lane] = my_id;
  }
}

template <class T>
void launch_topk_softmax(const TopkParams& p, Stream stream) {
  if (p.num_tokens == 0) return;
  const auto grid = unsigned((p.num_tokens + kWarps - 1) / kWarps);
  dispatch_pow2<kMaxPerLane>((p.num_experts + 31) / 32, [&](auto per) {
    launch_pdl(topk_softmax_kernel<T, decltype(per)::value>, dim3(grid), dim3(kWarps * 32), 0, stream, p);
  });
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

TopkSoftmax::TopkSoftmax(int64_t top_k, bool renormalize) : top_k_(top_k), renormalize_(renormalize) {
  KBN_CHECK(top_k >= 1, "TopkSoftmax: top_k must be positive, got ", top_k);
}

std::pair<Tensor, Tensor> TopkSoftmax::forward(const Tensor& gating_output) {
  constexpr const char* kOp = "topk_softmax";
  check_rank(gating_output, kOp, "gating_output", 2, "[num_tokens, num_experts]");
  check_dtype(gating_output, kOp, "gating_output", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(gating_output, kOp, "gating_output");
  const int64_t n = gating_output.size(0), e = gating_output.size(1);
  KBN_CHECK(top_k_ <= e, kOp, ": top_k (", top_k_, ") exceeds the experts of argument 'gating_output' ",
            gating_output.str());
  Tensor weights = Tensor::empty({n, top_k_}, DType::f32, gating_output.device());
  Tensor ids = Tensor::empty({n, top_k_}, DType::i32, gating_output.device());
  if (gating_output.is_cpu()) {
    reference::topk_softmax(weights, ids, gating_output, renormalize_);
    return {weights, ids};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(e <= 32 * kMaxPerLane, kOp, ": argument 'gating_output' has ", e, " experts; the kernel supports up to ",
            32 * kMaxPerLane);
  KBN_CHECK(top_k_ <= 32, kOp, ": top_k ", top_k_, " exceeds the kernel's 32 (one warp lane per chosen expert)");
  static const int32_t nan_code = device_error_code(
      "topk_softmax: argument 'gating_output' holds NaN in token {detail} (router logits must be numbers; on the GPU "
      "the NaN ranked last and the step ran on)");
  const TopkParams p{.weights = weights.data<float>(),
                     .ids = ids.data<int32_t>(),
                     .x = gating_output.data_ptr(),
                     .x_stride = gating_output.stride(0),
                     .num_tokens = n,
                     .num_experts = int(e),
                     .top_k = int(top_k_),
                     .renormalize = renormalize_,
                     .error = device_error_record(),
                     .nan_code = nan_code};
  dispatch_float16_32(gating_output.dtype(), kOp, "gating_output",
                      [&](auto t) { launch_topk_softmax<decltype(t)>(p, current_stream()); });
#endif
  return {weights, ids};
}

}  // namespace kbn::KBN_VARIANT
