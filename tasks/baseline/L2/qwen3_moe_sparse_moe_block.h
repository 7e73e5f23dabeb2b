#pragma once
// Qwen3MoeSparseMoeBlock (vLLM vllm/model_executor/models/qwen3_moe.py).
#include <string>

#include "L1/all_reduce.h"
#include "L2/fused_moe.h"
#include "L2/replicated_linear.h"
#include "configs/qwen3_moe.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

// Qwen3-MoE's sparse MLP (HF `mlp` of a sparse layer): gate = ReplicatedLinear(H, num_experts, no bias), then
// FusedMoE (top num_experts_per_tok of moe_intermediate_size experts, renormalized when norm_topk_prob) without
// its own reduce; the block all-reduces after it.
class Qwen3MoeSparseMoeBlock : public Module {
 public:
  Qwen3MoeSparseMoeBlock(const Qwen3MoeConfig& config, const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& hidden_states);
  // The same with the router's logits [num_tokens, num_experts] computed by the caller (the decoder layer's one-token
  // norm + router, rms_norm_gemv's forward_normed).
  Tensor forward_with_logits(const Tensor& hidden_states, const Tensor& router_logits);

  ReplicatedLinear gate;
  FusedMoE experts;

 private:
  AllReduce all_reduce_;
};

}  // namespace kbn::KBN_VARIANT
