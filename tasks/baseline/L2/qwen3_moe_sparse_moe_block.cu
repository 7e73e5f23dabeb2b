#include "L2/qwen3_moe_sparse_moe_block.h"

#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

Qwen3MoeSparseMoeBlock::Qwen3MoeSparseMoeBlock(const Qwen3MoeConfig& config, const std::string& prefix,
                                               const ParamOptions& opts)
    : gate(config.hidden_size, config.num_experts, false, false, opts, prefix + ".gate"),
      experts(config.num_experts, config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size,
              /*reduce_results=*/false, config.norm_topk_prob, prefix + ".experts", opts) {
  KBN_CHECK(parallel_state().tp_size <= config.num_experts, "Qwen3MoeSparseMoeBlock ", prefix,
            ": tensor-parallel size ", parallel_state().tp_size, " exceeds num_experts ", config.num_experts);
  register_module("gate", &gate);
  register_module("experts", &experts);
}

Tensor Qwen3MoeSparseMoeBlock::forward(const Tensor& hidden_states) {
  auto [router_logits, unused_bias] = gate.forward(hidden_states);
  return forward_with_logits(hidden_states, router_logits);
}

Tensor Qwen3MoeSparseMoeBlock::forward_with_logits(const Tensor& hidden_states, const Tensor& router_logits) {
  Tensor out = experts.forward(hidden_states, router_logits);
  if (parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return out;
}

}  // namespace kbn::KBN_VARIANT
