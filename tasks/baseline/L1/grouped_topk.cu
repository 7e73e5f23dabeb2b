#include "L1/grouped_topk.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device_errors.h"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----

constexpr int kMaxExperts = 512, kMaxGroups = 32, kWarps = 4;  // 34 KiB of static shared memory

struct GroupedTopkParams {
  const void* logits;  // [num_tokens, num_experts] token stride logit_stride
  const float* bias;   // [num_experts] or nullptr
  float* weights;      // [num_tokens, top_k]
  int32_t* ids;        // [num_tokens, top_k]
  int64_t num_tokens, logit_stride;
  int num_experts, num_groups, topk_group, top_k;
  bool sigmoid, renormalize;
  double scale;
  DeviceErrorRecord* error;
  int32_t nan_code;
};

// (value, index) argmax across the warp: the larger value wins, equal values the lower index; index -1 loses.
__device__ __forceinline__ void warp_argmax(double& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const double ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

// One warp per token; its scores and choices live in shared memory (doubles: the ranking is the oracle's).
template <class T>
__global__ void __launch_bounds__(kWarps * 32) grouped_topk_kernel(GroupedTopkParams p) {
  __shared__ double score_s[kWarps][kMaxExperts];
  __shared__ double choice_s[kWarps][kMaxExperts];
  __shared__ bool taken_s[kWarps][kMaxExperts];
  __shared__ double group_s[kWarps][kMaxGroups];
  __shared__ bool kept_s[kWarps][kMaxGroups];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= p.num_tokens) return;  // a whole warp leaves together
  const int E = p.num_experts, per_group = E / p.num_groups;
  double* score = score_s[warp];
  double* choice = choice_s[warp];
  bool* taken = taken_s[warp];
  const T* row = static_cast<const T*>(p.logits) + t * p.logit_stride;
  bool nan = false;
  double mx = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    const double x = double(to_f32(row[e]));
    nan = nan || x != x;
    score[e] = x;
    taken[e] = false;
    if (x > mx) mx = x;
  }
  if (__any_sync(0xffffffffu, nan) && lane == 0) {
    volatile DeviceErrorRecord* r = p.error;
    r->detail = t;
    r->code = p.nan_code;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  double sum = 0;
  for (int e = lane; e < E; e += 32) {
    const double x = score[e];
    const double s = p.sigmoid ? 1.0 / (1.0 + exp(-x)) : exp(x - mx);
    score[e] = s;
    if (s == s) sum += s;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  for (int e = lane; e < E; e += 32) {
    if (!p.sigmoid) score[e] /= sum;
    const double c = score[e] + (p.bias ? double(p.bias[e]) : 0.0);
    choice[e] = c != c ? -INFINITY : c;  // a NaN ranks last (and was reported)
  }
  __syncwarp();
  // Group scores: the best choice of each group, or with the bias the sum of its two best.
  if (lane < p.num_groups) {
    double best = -INFINITY, second = -INFINITY;
    for (int e = lane * per_group; e < (lane + 1) * per_group; ++e) {
      const double c = choice[e];
      if (c > best) {
        second = best;
        best = c;
      } else if (c > second) {
        second = c;
      }
    }
    group_s[warp][lane] = p.bias ? best + second : best;
    kept_s[warp][lane] = false;
  }
  __syncwarp();
  for (int j = 0; j < p.topk_group; ++j) {
    const bool open = lane < p.num_groups && !kept_s[warp][lane];
    double v = open ? group_s[warp][lane] : -INFINITY;
    int i = open ? lane : -1;
    warp_argmax(v, i);
    if (lane == 0 && i >= 0) kept_s[warp][i] = true;
    __syncwarp();
  }
  // The top_k experts of the kept groups, best first. The butterfly arg-max leaves the winner in every lane: lane j
  // keeps the j-th choice and its score, and the k lanes write ids and weights at the end (one lane reading the ids
  // back from global memory, one dependent load per choice, was most of a one-token call).
  double chosen_sum = 0, mine = 0;
  int my_id = 0;
  for (int j = 0; j < p.top_k; ++j) {
    double v = -INFINITY;
    int i = -1;
    for (int e = lane; e < E; e += 32) {
      if (taken[e] || !kept_s[warp][e / per_group]) continue;
      if (i < 0 || choice[e] > v) {  // ascending e: an equal choice keeps the lower index
        v = choice[e];
        i = e;
      }
    }
    warp_argmax(v, i);
    chosen_sum += score[i];
    if (lane == j) mine = score[i], my_id = i;
    if (lane == 0) taken[i] = true;
    __syncwarp();
  }
  if (lane < p.top_k) {
    const double w = p.renormalize ? mine / chosen_sum : mine;
    p.ids[t * p.top_k + lane] = my_id;
    p.weights[t * p.top_k + lane] = float(w * p.scale);
  }
}

}  // namespace
#endif  // KBN_WITH_CUDA

GroupedTopk::GroupedTopk(int64_t top_k, bool renormalize, int64_t num_expert_group, int64_t topk_group,
                         const std::string& scoring_func, double routed_scaling_factor)
    : top_k_(top_k),
      num_expert_group_(num_expert_group),
      topk_group_(topk_group),
      renormalize_(renormalize),
      sigmoid_(scoring_func == "sigmoid"),
      routed_scaling_factor_(routed_scaling_factor) {
  KBN_CHECK(scoring_func == "softmax" || scoring_func == "sigmoid",
            "GroupedTopk: argument 'scoring_func' must be softmax or sigmoid, got '", scoring_func, "'");
  KBN_CHECK(top_k >= 1, "GroupedTopk: argument 'top_k' must be positive, got ", top_k);
  KBN_CHECK(num_expert_group >= 1 && topk_group >= 1 && topk_group <= num_expert_group,
            "GroupedTopk: arguments 'num_expert_group' (", num_expert_group, ") and 'topk_group' (", topk_group,
            ") must satisfy 1 <= topk_group <= num_expert_group");
  KBN_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0,
            "GroupedTopk: argument 'routed_scaling_factor' must be positive, got ", routed_scaling_factor);
}

std::pair<Tensor, Tensor> GroupedTopk::forward(const Tensor& gating_output, const Tensor& e_score_correction_bias) {
  constexpr const char* op = "grouped_topk";
  check_rank(gating_output, op, "gating_output", 2, "[num_tokens, num_experts]");
  check_dtype(gating_output, op, "gating_output", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(gating_output, op, "gating_output");
  const int64_t T = gating_output.size(0), E = gating_output.size(1);
  KBN_CHECK(E % num_expert_group_ == 0, op, ": num_expert_group (", num_expert_group_,
            ") must divide the experts of 'gating_output' ", gating_output.str());
  KBN_CHECK(top_k_ <= topk_group_ * (E / num_expert_group_), op, ": top_k (", top_k_, ") exceeds the ",
            topk_group_ * (E / num_expert_group_), " experts of topk_group (", topk_group_, ") groups");
  if (e_score_correction_bias.defined()) {
    check_rank(e_score_correction_bias, op, "e_score_correction_bias", 1, "[num_experts]");
    check_size(e_score_correction_bias, op, "e_score_correction_bias", 0, E, "num_experts");
    check_dtype(e_score_correction_bias, op, "e_score_correction_bias", {DType::f32});
    check_contiguous(e_score_correction_bias, op, "e_score_correction_bias");
    check_same_device(gating_output, e_score_correction_bias, op, "gating_output", "e_score_correction_bias");
  }
  Tensor weights = Tensor::empty({T, top_k_}, DType::f32, gating_output.device());
  Tensor ids = Tensor::empty({T, top_k_}, DType::i32, gating_output.device());
  const std::string scoring = sigmoid_ ? "sigmoid" : "softmax";
  if (gating_output.is_cpu()) {
    reference::grouped_topk(weights, ids, gating_output, renormalize_, num_expert_group_, topk_group_, scoring,
                            routed_scaling_factor_, e_score_correction_bias);
    return {weights, ids};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(E <= kMaxExperts && num_expert_group_ <= kMaxGroups, op, ": the kernel takes at most ", kMaxExperts,
            " experts in at most ", kMaxGroups, " groups, got ", E, " in ", num_expert_group_);
  KBN_CHECK(!e_score_correction_bias.defined() || E / num_expert_group_ >= 2, op,
            ": with 'e_score_correction_bias' a group is scored by its two best experts, but its groups hold ",
            E / num_expert_group_);
  KBN_CHECK(top_k_ <= 32, op, ": top_k ", top_k_, " exceeds the kernel's 32 (one warp lane per chosen expert)");
  if (T == 0) return {weights, ids};
  static const int32_t nan_code = device_error_code(
      "grouped_topk: argument 'gating_output' holds NaN in token {detail} (router logits must be numbers; on the GPU "
      "the NaN ranked last and the step ran on)");
  GroupedTopkParams p{.logits = gating_output.data_ptr(),
                      .bias = e_score_correction_bias.defined() ? e_score_correction_bias.data<float>() : nullptr,
                      .weights = weights.data<float>(),
                      .ids = ids.data<int32_t>(),
                      .num_tokens = T,
                      .logit_stride = gating_output.stride(0),
                      .num_experts = int(E),
                      .num_groups = int(num_expert_group_),
                      .topk_group = int(topk_group_),
                      .top_k = int(top_k_),
                      .sigmoid = sigmoid_,
                      .renormalize = renormalize_,
                      .scale = routed_scaling_factor_,
                      .error = device_error_record(),
                      .nan_code = nan_code};
  dispatch_float16_32(gating_output.dtype(), op, "gating_output", [&](auto v) {
    using T = decltype(v);
    grouped_topk_kernel<T><<<unsigned((p.num_tokens + kWarps - 1) / kWarps), kWarps * 32, 0, current_stream()>>>(p);
    KBN_CUDA_CHECK_LAUNCH();
  });
#endif
  return {weights, ids};
}

}  // namespace kbn::KBN_VARIANT
