#include "L2/mlp_block.h"

namespace kbn::KBN_VARIANT {

MLPBlock::MLPBlock(const GptOssConfig& c, const std::string& prefix, const ParamOptions& opts)
    : router(c.hidden_size, c.num_local_experts, true, false, opts, prefix + ".router"),
      experts(c.num_local_experts, c.num_experts_per_tok, c.hidden_size, c.intermediate_size, /*reduce_results=*/true,
              /*renormalize=*/true, prefix + ".experts", opts,
              {.activation = FusedExperts::Activation::swigluoai,
               .swiglu_alpha = c.swiglu_alpha,
               .swiglu_limit = c.swiglu_limit,
               .has_bias = true}) {
  register_module("router", &router);
  register_module("experts", &experts);
}

Tensor MLPBlock::forward(const Tensor& hidden_states) {
  auto [router_logits, unused_bias] = router.forward(hidden_states);
  return experts.forward(hidden_states, router_logits);
}

}  // namespace kbn::KBN_VARIANT
