#include "L2/deepseek_v2_moe.h"

#include "kbn/parallel_state.h"

// The shared experts' sum folded into fused_experts (FusedExperts::forward_add) stays off when tasks/candidate/
// replaces fused_experts, moe_sum or FusedMoE, so a candidate of those is reached at every token count.
#if defined(KBN_CANDIDATE_REPLACES_L1_fused_experts_h) || defined(KBN_CANDIDATE_REPLACES_L1_fused_experts_cu) || \
    defined(KBN_CANDIDATE_REPLACES_L1_moe_sum_h) || defined(KBN_CANDIDATE_REPLACES_L1_moe_sum_cu) ||             \
    defined(KBN_CANDIDATE_REPLACES_L2_fused_moe_h) || defined(KBN_CANDIDATE_REPLACES_L2_fused_moe_cu)
#define KBN_DEEPSEEK_SHARED_SUM_FUSION 0
#else
#define KBN_DEEPSEEK_SHARED_SUM_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

DeepseekV2MoE::DeepseekV2MoE(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts)
    : experts(config.n_routed_experts, config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size,
              /*reduce_results=*/false, /*renormalize=*/false, prefix + ".experts", opts),
      router_(config.num_experts_per_tok, config.norm_topk_prob, config.n_group, config.topk_group, config.scoring_func,
              config.routed_scaling_factor) {
  KBN_CHECK(config.n_routed_experts > 0, "DeepseekV2MoE ", prefix, ": n_routed_experts must be positive, got ",
            config.n_routed_experts);
  gate_weight = Tensor::empty({config.n_routed_experts, config.hidden_size}, opts.dtype, opts.device);
  register_parameter("gate.weight", &gate_weight, InitKind::normal);
  if (config.topk_method == "noaux_tc") {
    e_score_correction_bias = Tensor::empty({config.n_routed_experts}, DType::f32, opts.device);
    register_parameter("gate.e_score_correction_bias", &e_score_correction_bias, InitKind::zeros);
  }
  register_module("experts", &experts);
  if (config.n_shared_experts > 0) {
    shared_experts =
        std::make_unique<LlamaMLP>(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts, "silu",
                                   false, prefix + ".shared_experts", opts);
    register_module("shared_experts", shared_experts.get());
  }
}

Tensor DeepseekV2MoE::forward(const Tensor& hidden_states) {
  const Tensor router_logits = gate_.forward(hidden_states, gate_weight);
  auto [topk_weights, topk_ids] = router_.forward(router_logits, e_score_correction_bias);
#if KBN_DEEPSEEK_SHARED_SUM_FUSION
  // At TP 1 the shared experts' output goes into the routed experts' sum (one token: in GEMM 2's kernel), the same
  // bits as the two-term moe_sum below.
  if (shared_experts && parallel_state().tp_size == 1)
    return experts.forward_routed(hidden_states, topk_weights, topk_ids, shared_experts->forward(hidden_states));
#endif
  Tensor out = experts.forward_routed(hidden_states, topk_weights, topk_ids);
  if (parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  if (!shared_experts) return out;
  // NOTE: the shared MLP's down projection all-reduces on its own; the sum is a [T, 2, H] moe_sum (two copies and a
  // sum, where vLLM adds in place).
  const Tensor shared = shared_experts->forward(hidden_states);
  const int64_t T = out.size(0), H = out.size(1);
  Tensor both = Tensor::empty({T, 2, H}, out.dtype(), out.device());
  both.select(1, 0).copy_(out);
  both.select(1, 1).copy_(shared);
  return sum_.forward(both);
}

}  // namespace kbn::KBN_VARIANT
