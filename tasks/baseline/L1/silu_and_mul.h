#pragma once
// SiluAndMul (vLLM vllm/model_executor/layers/activation.py): out = silu(x[:, :d]) * x[:, d:].
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class SiluAndMul : public Module {
 public:
  SiluAndMul() = default;
  // x: [num_tokens, 2 * d] -> new [num_tokens, d]
  Tensor forward(const Tensor& x);
};

}  // namespace kbn::KBN_VARIANT
