#pragma once
// DeepSeek's MoE router (vLLM's grouped_topk, fused_moe.py): per token, scores over the experts (softmax, or sigmoid),
// the experts split into num_expert_group groups of consecutive ids of which the topk_group best are kept (a group
// scores its best expert, or with V3's score-correction bias the sum of its two best biased scores), the top_k experts
// of the kept groups chosen by score (+ bias), weighted by their unbiased scores, renormalised when asked, times
// routed_scaling_factor. Ties, of groups and of experts, go to the lower index; the k experts are listed best first.
// Scores are computed in double (the ranking then matches the oracle's). A NaN logit is an error: on CPU tensors at
// once, on the GPU recorded (kbn/device_errors.h) and raised by check_device_errors() after the next synchronisation.
#include <string>
#include <utility>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GroupedTopk : public Module {
 public:
  // scoring_func: "softmax" or "sigmoid".
  GroupedTopk(int64_t top_k, bool renormalize, int64_t num_expert_group, int64_t topk_group,
              const std::string& scoring_func, double routed_scaling_factor);
  // gating_output: [num_tokens, num_experts] (f32, f16 or bf16; row stride free); e_score_correction_bias: [num_experts]
  // f32 or undefined -> (topk_weights new [num_tokens, top_k] f32, topk_ids new [num_tokens, top_k] i32).
  // num_experts at most 512 and num_expert_group at most 32 on the GPU.
  std::pair<Tensor, Tensor> forward(const Tensor& gating_output, const Tensor& e_score_correction_bias);

 private:
  int64_t top_k_, num_expert_group_, topk_group_;
  bool renormalize_, sigmoid_;
  double routed_scaling_factor_;
};

}  // namespace kbn::KBN_VARIANT
