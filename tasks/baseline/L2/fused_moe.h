#pragma once
// FusedMoE (vLLM vllm/model_executor/layers/fused_moe/layer.py) with softmax top-k routing: the experts of MixtralMoE
// (L2/mixtral_moe.h), Qwen3MoeSparseMoeBlock (L2/qwen3_moe_sparse_moe_block.h), DeepseekV2MoE and gpt-oss's MLPBlock
// (L2/mlp_block.h: swigluoai experts with biases, vLLM's activation="swigluoai", has_bias=True).
//
// Tensor parallelism as vLLM's (no expert parallelism): every rank holds every expert, each expert's intermediate
// dimension split over the ranks; a rank's partial outputs are summed by one all-reduce (inside FusedMoE when
// reduce_results, as Mixtral builds it; after it in Qwen3MoeSparseMoeBlock, as vLLM's Qwen3-MoE does).
//
// Checkpoints hold one tensor per expert and projection (HF names `experts.{e}.w1/w3/w2` for Mixtral,
// `experts.{e}.gate_proj/up_proj/down_proj` for Qwen3-MoE); make_expert_params_mapping lists where each lands in
// the stacked parameters (kbn/weight_loading.h). The one fused layout read is gpt-oss's, loaded whole into a
// parameter (no shard id; gpt_oss_expert_names maps its names): w13_weight from gate_up_proj [E, H, 2N] whose gate
// and up columns interleave (de-interleaved into the gate and up halves and transposed), w13_bias from
// gate_up_proj_bias [E, 2N] likewise, w2_weight from down_proj [E, N, H] (transposed), w2_bias from down_proj_bias
// [E, H] (held by rank 0 only, zeros elsewhere, so the all-reduce adds it once).
#include <string>
#include <vector>

#include "L1/all_reduce.h"
#include "L1/fused_experts.h"
#include "L1/topk_softmax.h"
#include "kbn/variant.h"
#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

// The experts' activation and biases (vLLM FusedMoE's activation and has_bias).
struct ExpertOptions {
  FusedExperts::Activation activation = FusedExperts::Activation::silu;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;  // swigluoai's
  bool has_bias = false;                            // w13_bias and w2_bias
};

class FusedMoE : public Module {
 public:
  // intermediate_size: one expert's full intermediate size (each rank holds intermediate_size / tp of it).
  FusedMoE(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size, bool reduce_results,
           bool renormalize, const std::string& prefix, const ParamOptions& opts, const ExpertOptions& experts = {});

  // hidden_states: [num_tokens, hidden_size] contiguous; router_logits: [num_tokens, num_experts]
  // -> [num_tokens, hidden_size] (summed over the ranks when reduce_results)
  Tensor forward(const Tensor& hidden_states, const Tensor& router_logits);
  // The experts with a routing computed elsewhere (vLLM's FusedMoE with a custom routing function; DeepSeek's
  // grouped_topk): topk_weights [num_tokens, top_k] f32, topk_ids [num_tokens, top_k] i32 -> as forward.
  // addend (optional, [num_tokens, hidden_size]): added to the experts' rounded output as FusedExperts::forward_add
  // does (DeepSeek's shared experts); not with an all-reduce inside (reduce_results at TP > 1), which would add it once
  // per rank.
  Tensor forward_routed(const Tensor& hidden_states, const Tensor& topk_weights, const Tensor& topk_ids,
                        const Tensor& addend = {});

  // Checkpoint part -> stacked parameter of every expert: (".experts.w13_", ".experts.{e}.<gate>.", "{e}.w1"),
  // (".experts.w13_", ".experts.{e}.<up>.", "{e}.w3"), (".experts.w2_", ".experts.{e}.<down>.", "{e}.w2").
  static std::vector<StackedParam> make_expert_params_mapping(const std::string& ckpt_gate_proj_name,
                                                              const std::string& ckpt_down_proj_name,
                                                              const std::string& ckpt_up_proj_name,
                                                              int64_t num_experts);

  // gpt-oss's fused checkpoint names -> this module's parameters ("<p>.experts.gate_up_proj" ->
  // "<p>.experts.w13_weight", gate_up_proj_bias -> w13_bias, down_proj -> w2_weight, down_proj_bias -> w2_bias); any
  // other name is returned as is.
  static std::string gpt_oss_expert_names(const std::string& ckpt_name);

  int64_t num_experts() const { return num_experts_; }
  int64_t intermediate_size_per_partition() const { return intermediate_size_per_partition_; }

  Tensor w13_weight;  // [num_experts, 2 * intermediate_size / tp, hidden_size]: gate rows, then up rows
  Tensor w2_weight;   // [num_experts, hidden_size, intermediate_size / tp]
  Tensor w13_bias;    // [num_experts, 2 * intermediate_size / tp] when has_bias (gate, then up)
  Tensor w2_bias;     // [num_experts, hidden_size] when has_bias

 private:
  int64_t num_experts_, hidden_size_, intermediate_size_per_partition_;
  bool reduce_results_;
  TopkSoftmax select_experts_;
  FusedExperts fused_experts_;
  AllReduce all_reduce_;
};

}  // namespace kbn::KBN_VARIANT
