#pragma once
// GeluAndMul (vLLM vllm/model_executor/layers/activation.py): out = gelu(x[:, :d]) * x[:, d:], with the exact gelu
// (approximate "none") or its tanh approximation ("tanh", Gemma-3's "gelu_pytorch_tanh").
#include <string>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GeluAndMul : public Module {
 public:
  // approximate: "none" or "tanh" (as torch.nn.functional.gelu); anything else is an error naming it.
  explicit GeluAndMul(const std::string& approximate = "none");
  // x: [num_tokens, 2 * d] -> new [num_tokens, d]
  Tensor forward(const Tensor& x);

  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

}  // namespace kbn::KBN_VARIANT
