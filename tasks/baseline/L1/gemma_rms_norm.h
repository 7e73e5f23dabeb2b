#pragma once
// GemmaRMSNorm (vLLM vllm/model_executor/layers/layernorm.py): y = x / sqrt(mean(x^2) + eps) * (1 + weight), computed
// in fp32 and rounded once to the activation dtype. The weight is stored as Gemma's checkpoints hold it (an offset
// from 1) and a freshly built module holds zeros (scale 1), as vLLM initialises it.
#include <utility>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GemmaRMSNorm : public Module {
 public:
  GemmaRMSNorm(int64_t hidden_size, double eps = 1e-6, const ParamOptions& opts = {});

  // x: [num_tokens, hidden_size] -> new [num_tokens, hidden_size], or x: [num_tokens, heads, hidden_size] (each
  // head normalised, as Gemma-3's q/k norms; token and head strides free, e.g. q or k viewed inside the fused qkv
  // output) -> new contiguous [num_tokens, heads, hidden_size]
  Tensor forward(const Tensor& x);
  // Fused add + norm, in place like RMSNorm's (mutates x and residual): residual <- x + residual (rounded);
  // x <- norm(residual). Returns (x, residual).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual);

  int64_t hidden_size() const { return hidden_size_; }
  double eps() const { return eps_; }

  Tensor weight;  // [hidden_size]: the scale is 1 + weight

 private:
  int64_t hidden_size_;
  double eps_;
};

}  // namespace kbn::KBN_VARIANT
