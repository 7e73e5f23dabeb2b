#pragma once
// RMSNormGemv (kb-nano's; vLLM has no such op): a decode step's RMSNorm, with the residual add when there is one, folded
// into the one-token linear that reads its output, and optionally SiluAndMul or GeluAndMul("tanh") folded into that
// linear's output. At
// batch 1 a decoder layer is four weight streams with a train of small kernels between them (the norms, the
// activation), each a launch and a ramp on the critical path; this op is the norm + qkv_proj and norm + gate_up_proj +
// silu*mul pairs as one kernel each. Same arithmetic as the ops it replaces (fused_add_rms_norm's / rms_norm's sum
// order and scaling, rounded to the dtype; linear's one-token dot products; silu_and_mul's / gelu_and_mul's fp32
// activation of the rounded gate and up), so the same bits.
#include <tuple>
#include <utility>

#include "kbn/variant.h"

// 1 when tasks/candidate/ replaces a file whose work this op takes over in every layer that uses it (the norms,
// linear, silu_and_mul, the parallel linears that call linear; kbn/variant.h): such a layer then keeps calling them,
// so the candidate is reached at every token count. Each layer adds its own L2 blocks' files to the test.
#if defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_h) || defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_cu) ||     \
    defined(KBN_CANDIDATE_REPLACES_L1_rms_norm_cuh) || defined(KBN_CANDIDATE_REPLACES_L1_linear_h) ||      \
    defined(KBN_CANDIDATE_REPLACES_L1_linear_cu) || defined(KBN_CANDIDATE_REPLACES_L1_silu_and_mul_h) ||   \
    defined(KBN_CANDIDATE_REPLACES_L1_silu_and_mul_cu) || defined(KBN_CANDIDATE_REPLACES_L2_parallel_linear_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_parallel_linear_cu)
#define KBN_NORM_GEMV_FOLDS_A_CANDIDATE 1
#else
#define KBN_NORM_GEMV_FOLDS_A_CANDIDATE 0
#endif

namespace kbn::KBN_VARIANT {

// What the op applies to the linear's output: nothing, or an activation of its [gate; up] halves (the linear's rows
// are then a MergedColumnParallelLinear's two equal halves and the op returns act(gate) * up).
enum class NormGemvAct : int {
  none = 0,
  silu_and_mul = 1,       // SiluAndMul (Llama, Qwen3)
  gelu_tanh_and_mul = 2,  // GeluAndMul("tanh") (Gemma-3)
};

class RMSNormGemv : public Module {
 public:
  // eps: the norm's; weight_offset: 0 (RMSNorm) or 1 (GemmaRMSNorm's 1 + w); act: what follows the linear.
  RMSNormGemv(double eps, double weight_offset = 0.0, NormGemvAct act = NormGemvAct::none);

  // x: [num_tokens, hidden] (one token on the GPU); residual: [num_tokens, hidden] in x's dtype, or f32 with 16-bit x
  // (Mamba-2's residual_in_fp32, RMSNorm only), or undefined; norm_weight: [hidden]; weight: [out_features, hidden]
  // contiguous; bias: [out_features] or undefined. h = x + residual rounded to the residual's dtype (x without a
  // residual); y = norm(h) * (weight_offset + norm_weight) rounded; out = y weight^T + bias, or act(out[:, :n]) *
  // out[:, n:] with n = out_features / 2. Returns (out, h): h new (the residual's dtype) when residual is given,
  // undefined otherwise (the caller's residual is then x itself). Mutates nothing.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                    const Tensor& weight, const Tensor& bias);
  // forward, also returning the normalised row y [num_tokens, hidden] (x's dtype; rms_norm's / fused_add_rms_norm's
  // output bits), written once by the kernel, for the ops that read the norm's output beside this linear (Qwen3-MoE's
  // experts beside its router): (out, h, y).
  std::tuple<Tensor, Tensor, Tensor> forward_normed(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                                    const Tensor& weight, const Tensor& bias);

  // Whether the GPU kernel takes (dtype, num_tokens, hidden): one token, f32 / f16 / bf16, hidden a multiple of the
  // 16-byte vector and at most 40 KiB of it (the normalised row is staged in shared memory). Callers run the norm
  // and the linear (and silu_and_mul) elsewhere; forward refuses the rest on the GPU by name.
  static bool kernel_supports(DType dtype, int64_t num_tokens, int64_t hidden);
  // Whether a layer takes the op for hidden_states x: one token, always on CPU tensors (where the op composes the
  // same oracles as the separate ops), on the GPU where kernel_supports says so.
  static bool applies(const Tensor& x);

  double eps() const { return eps_; }
  double weight_offset() const { return weight_offset_; }
  NormGemvAct act() const { return act_; }

 private:
  // forward and forward_normed (normed: where the normalised row goes, or null).
  std::pair<Tensor, Tensor> run(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                const Tensor& weight, const Tensor& bias, Tensor* normed);

  double eps_, weight_offset_;
  NormGemvAct act_;
};

}  // namespace kbn::KBN_VARIANT
