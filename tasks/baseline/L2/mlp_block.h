#pragma once
// MLPBlock (vLLM vllm/model_executor/models/gpt_oss.py; HF GptOssMLP): router = a linear with bias (H -> E), top-k of
// its logits with the softmax over the chosen (the same weights as a renormalized top-k softmax), and FusedMoE with
// swigluoai experts (alpha, swiglu_limit) and biases, the all-reduce inside.
#include <string>

#include "L2/fused_moe.h"
#include "L2/replicated_linear.h"
#include "configs/gpt_oss.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MLPBlock : public Module {
 public:
  MLPBlock(const GptOssConfig& config, const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& hidden_states);

  ReplicatedLinear router;
  FusedMoE experts;
};

}  // namespace kbn::KBN_VARIANT
