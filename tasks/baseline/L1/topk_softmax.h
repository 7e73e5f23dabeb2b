#pragma once
// The MoE router's top-k (vLLM fused_topk / ops.topk_softmax): softmax over each token's expert logits in fp32, the
// top_k experts, and, with renormalize, their weights divided by their sum.
// Tie rule: experts rank by logit (the softmax is monotonic, so ranking the exact input values makes the choice
// independent of how the softmax is rounded); equal logits rank the lower expert index first; a NaN logit ranks
// below every number and is an error: on CPU tensors at once, naming the token and expert; on the GPU the kernel
// records it (kbn/device_errors.h) and kbn::check_device_errors() raises it, naming the token, after the next
// synchronisation (the engine checks after every step that samples). The k chosen experts are listed best first.
#include <utility>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class TopkSoftmax : public Module {
 public:
  TopkSoftmax(int64_t top_k, bool renormalize);
  // gating_output: [num_tokens, num_experts] (f32, f16 or bf16; row stride may exceed num_experts), 1 <= top_k <=
  // num_experts -> (topk_weights new [num_tokens, top_k] f32, topk_ids new [num_tokens, top_k] i32)
  std::pair<Tensor, Tensor> forward(const Tensor& gating_output);

  int64_t top_k() const { return top_k_; }
  bool renormalize() const { return renormalize_; }

 private:
  int64_t top_k_;
  bool renormalize_;
};

}  // namespace kbn::KBN_VARIANT
