#pragma once
// vLLM ops.moe_sum: each token's top_k expert outputs (already scaled by their routing weights) summed in fp32, in
// expert-slot order.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MoeSum : public Module {
 public:
  MoeSum() = default;
  // input: [num_tokens, top_k, hidden] contiguous (f32, f16 or bf16) -> new [num_tokens, hidden]
  Tensor forward(const Tensor& input);
};

}  // namespace kbn::KBN_VARIANT
