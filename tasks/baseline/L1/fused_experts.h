#pragma once
// vLLM fused_experts (fused_moe.py): for each token t and each of its top_k experts e = topk_ids[t, j],
// y = w2[e] @ act(g, u) + b2[e] with [g; u] = w13[e] @ x[t] + b13[e], and out[t] = sum_j topk_weights[t, j] * y.
// act is silu(g) * u (Mixtral, Qwen3-MoE, DeepSeek) or gpt-oss's swigluoai (reference::ExpertFeatures); the biases
// are optional (gpt-oss has them). The expert GEMMs run grouped: the pairs are aligned per expert
// (L1/moe_align_block_size.h), gathered into expert order, multiplied block by block with their expert's weights
// (w2's output scaled by the routing weight), and summed per token (L1/moe_sum.h). Up to 8 tokens (decode) take two
// GEMV kernels instead that stream each touched expert's rows once for all its tokens, with no alignment. Intermediates
// are rounded to the activation dtype as vLLM's caches are.
#include "kbn/variant.h"
#include "reference/reference.h"

namespace kbn::KBN_VARIANT {

class FusedExperts : public Module {
 public:
  using Activation = reference::ExpertFeatures::Activation;
  // activation: vLLM's `activation` ("silu" or "swigluoai"); alpha and limit: swigluoai's (gpt-oss: 1.702 and the
  // config's swiglu_limit). Errors name the argument.
  explicit FusedExperts(Activation activation = Activation::silu, double alpha = 1.702, double limit = 7.0);
  // hidden_states: [num_tokens, hidden] contiguous; w13: [num_experts, 2 * inter, hidden] (gate rows, then up rows)
  // contiguous; w2: [num_experts, hidden, inter] contiguous; all three of one dtype (f32, f16, bf16);
  // topk_weights: [num_tokens, top_k] f32; topk_ids: [num_tokens, top_k] i32 in [0, num_experts);
  // w13_bias [num_experts, 2 * inter] and w2_bias [num_experts, hidden] (contiguous, the weights' dtype) or undefined
  // -> new [num_tokens, hidden]
  Tensor forward(const Tensor& hidden_states, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
                 const Tensor& topk_ids, const Tensor& w13_bias = {}, const Tensor& w2_bias = {});
  // round(forward(...) + addend): the experts' output, rounded to the activation dtype, plus addend [num_tokens,
  // hidden] (contiguous, hidden_states' dtype and device) summed in fp32 and rounded again: the bits of moe_sum over
  // the two stacked (DeepSeek's routed + shared experts). One token on the decode path adds it in GEMM 2's kernel (no
  // extra launch); elsewhere a two-term moe_sum follows.
  Tensor forward_add(const Tensor& addend, const Tensor& hidden_states, const Tensor& w13, const Tensor& w2,
                     const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13_bias = {},
                     const Tensor& w2_bias = {});

  Activation activation() const { return activation_; }

 private:
  Tensor run(const Tensor& hidden_states, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
             const Tensor& topk_ids, const Tensor& w13_bias, const Tensor& w2_bias, const Tensor& addend);

  Activation activation_;
  double alpha_, limit_;
};

}  // namespace kbn::KBN_VARIANT
