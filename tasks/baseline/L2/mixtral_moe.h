#pragma once
// MixtralMoE (vLLM vllm/model_executor/models/mixtral.py).
#include <string>

#include "L2/fused_moe.h"
#include "L2/replicated_linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

// Mixtral's sparse MLP (HF `block_sparse_moe`): gate = ReplicatedLinear(H, E, no bias), then FusedMoE with
// renormalized top-k weights and the all-reduce inside.
class MixtralMoE : public Module {
 public:
  MixtralMoE(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
             const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& hidden_states);

  ReplicatedLinear gate;
  FusedMoE experts;
};

}  // namespace kbn::KBN_VARIANT
