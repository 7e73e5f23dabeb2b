#pragma once
// SwigluOAIAndMul (vLLM vllm/model_executor/layers/activation.py, gpt-oss's expert activation). Interleaved layout:
// gate = x[:, 0::2], up = x[:, 1::2]; gate = min(gate, limit), up = clamp(up, -limit, limit);
// out = (up + 1) * gate * sigmoid(alpha * gate).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class SwigluOAIAndMul : public Module {
 public:
  // alpha: finite; limit: positive (gpt-oss's swiglu_limit). Errors name the argument.
  explicit SwigluOAIAndMul(double alpha = 1.702, double limit = 7.0);
  // x: [num_tokens, 2 * d] (gate, up interleaved) -> new [num_tokens, d]
  Tensor forward(const Tensor& x);

  double alpha() const { return alpha_; }
  double limit() const { return limit_; }

 private:
  double alpha_, limit_;
};

}  // namespace kbn::KBN_VARIANT
