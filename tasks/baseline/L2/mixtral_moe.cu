#include "L2/mixtral_moe.h"

namespace kbn::KBN_VARIANT {

MixtralMoE::MixtralMoE(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
                       const std::string& prefix, const ParamOptions& opts)
    : gate(hidden_size, num_experts, false, false, opts, prefix + ".gate"),
      experts(num_experts, top_k, hidden_size, intermediate_size, /*reduce_results=*/true, /*renormalize=*/true,
              prefix + ".experts", opts) {
  register_module("gate", &gate);
  register_module("experts", &experts);
}

Tensor MixtralMoE::forward(const Tensor& hidden_states) {
  auto [router_logits, unused_bias] = gate.forward(hidden_states);
  return experts.forward(hidden_states, router_logits);
}

}  // namespace kbn::KBN_VARIANT
