#pragma once
// vLLM fused_experts (fused_moe.py) with the silu activation: for each token t and each of its top_k experts
// e = topk_ids[t, j], y = w2[e] @ (silu(g) * u) with [g; u] = w13[e] @ x[t], and out[t] = sum_j topk_weights[t, j] * y.
// The expert GEMMs run grouped: the pairs are aligned per expert (L1/moe_align_block_size.h), gathered into expert
// order, multiplied block by block with their expert's weights (w2's output scaled by the routing weight), and
// summed per token (L1/moe_sum.h). Intermediates are rounded to the activation dtype as vLLM's caches are.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FusedExperts : public Module {
 public:
  FusedExperts() = default;
  // hidden_states: [num_tokens, hidden] contiguous; w13: [num_experts, 2 * inter, hidden] (gate rows, then up rows)
  // contiguous; w2: [num_experts, hidden, inter] contiguous; all three of one dtype (f32, f16, bf16);
  // topk_weights: [num_tokens, top_k] f32; topk_ids: [num_tokens, top_k] i32 in [0, num_experts)
  // -> new [num_tokens, hidden]
  Tensor forward(const Tensor& hidden_states, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
                 const Tensor& topk_ids);
};

}  // namespace kbn::KBN_VARIANT
