#pragma once
// FusedMoE (vLLM vllm/model_executor/layers/fused_moe/layer.py) with softmax top-k routing and silu experts: the
// experts of MixtralMoE (L2/mixtral_moe.h) and Qwen3MoeSparseMoeBlock (L2/qwen3_moe_sparse_moe_block.h).
//
// Tensor parallelism as vLLM's (no expert parallelism): every rank holds every expert, each expert's intermediate
// dimension split over the ranks; a rank's partial outputs are summed by one all-reduce (inside FusedMoE when
// reduce_results, as Mixtral builds it; after it in Qwen3MoeSparseMoeBlock, as vLLM's Qwen3-MoE does).
//
// Checkpoints hold one tensor per expert and projection (HF names `experts.{e}.w1/w3/w2` for Mixtral,
// `experts.{e}.gate_proj/up_proj/down_proj` for Qwen3-MoE); make_expert_params_mapping lists where each lands in
// the stacked parameters (kbn/weight_loading.h). Fused checkpoint layouts are not read.
#include <string>
#include <vector>

#include "L1/all_reduce.h"
#include "L1/fused_experts.h"
#include "L1/topk_softmax.h"
#include "kbn/variant.h"
#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

class FusedMoE : public Module {
 public:
  // intermediate_size: one expert's full intermediate size (each rank holds intermediate_size / tp of it).
  FusedMoE(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size, bool reduce_results,
           bool renormalize, const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] contiguous; router_logits: [num_tokens, num_experts]
  // -> [num_tokens, hidden_size] (summed over the ranks when reduce_results)
  Tensor forward(const Tensor& hidden_states, const Tensor& router_logits);
  // The experts with a routing computed elsewhere (vLLM's FusedMoE with a custom routing function; DeepSeek's
  // grouped_topk): topk_weights [num_tokens, top_k] f32, topk_ids [num_tokens, top_k] i32 -> as forward.
  Tensor forward_routed(const Tensor& hidden_states, const Tensor& topk_weights, const Tensor& topk_ids);

  // Checkpoint part -> stacked parameter of every expert: (".experts.w13_", ".experts.{e}.<gate>.", "{e}.w1"),
  // (".experts.w13_", ".experts.{e}.<up>.", "{e}.w3"), (".experts.w2_", ".experts.{e}.<down>.", "{e}.w2").
  static std::vector<StackedParam> make_expert_params_mapping(const std::string& ckpt_gate_proj_name,
                                                              const std::string& ckpt_down_proj_name,
                                                              const std::string& ckpt_up_proj_name,
                                                              int64_t num_experts);

  int64_t num_experts() const { return num_experts_; }
  int64_t intermediate_size_per_partition() const { return intermediate_size_per_partition_; }

  Tensor w13_weight;  // [num_experts, 2 * intermediate_size / tp, hidden_size]: gate rows, then up rows
  Tensor w2_weight;   // [num_experts, hidden_size, intermediate_size / tp]

 private:
  int64_t num_experts_, hidden_size_, intermediate_size_per_partition_;
  bool reduce_results_;
  TopkSoftmax select_experts_;
  FusedExperts fused_experts_;
  AllReduce all_reduce_;
};

}  // namespace kbn::KBN_VARIANT
