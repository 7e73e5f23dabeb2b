#pragma once
// DeepseekV2MoE (vLLM vllm/model_executor/models/deepseek_v2.py): a router GEMM (`gate.weight`, no bias, f32 logits
// as DeepSeek's MoEGate and HF's DeepseekV3TopkRouter compute them: L1/router_gemm.h; V3 adds the score-correction
// bias `gate.e_score_correction_bias`), DeepSeek's grouped top-k routing (L1/grouped_topk.h: softmax
// or sigmoid scores, n_group / topk_group, renormalised when norm_topk_prob, times routed_scaling_factor), the routed
// experts (FusedMoE, fed that routing), plus the shared experts: one MLP of n_shared_experts * moe_intermediate_size
// that every token passes through. out = routed + shared.
#include <memory>
#include <string>

#include "L1/all_reduce.h"
#include "L1/grouped_topk.h"
#include "L1/moe_sum.h"
#include "L1/router_gemm.h"
#include "L2/fused_moe.h"
#include "L2/llama_mlp.h"
#include "configs/deepseek_v2.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class DeepseekV2MoE : public Module {
 public:
  DeepseekV2MoE(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] contiguous -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& hidden_states);

  Tensor gate_weight;              // gate.weight [n_routed_experts, hidden_size], replicated on every rank
  Tensor e_score_correction_bias;  // [n_routed_experts] f32; defined only for topk_method "noaux_tc"
  FusedMoE experts;
  std::unique_ptr<LlamaMLP> shared_experts;  // null when n_shared_experts is 0

 private:
  RouterGemm gate_;
  GroupedTopk router_;
  MoeSum sum_;  // routed + shared, as a two-term moe_sum
  AllReduce all_reduce_;
};

}  // namespace kbn::KBN_VARIANT
