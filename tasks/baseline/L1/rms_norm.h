#pragma once
// RMSNorm (vLLM vllm/model_executor/layers/layernorm.py): y = x / sqrt(mean(x^2) + eps) * weight.
#include <utility>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t hidden_size, double eps = 1e-6, const ParamOptions& opts = {});

  // x: [num_tokens, hidden_size] -> new [num_tokens, hidden_size], or x: [num_tokens, heads, hidden_size] (each
  // head normalised, as Qwen3's q/k norms; token and head strides free, e.g. q or k viewed inside the fused qkv
  // output) -> new contiguous [num_tokens, heads, hidden_size]
  Tensor forward(const Tensor& x);
  // Fused add + norm, in place like vLLM's fused_add_rms_norm (mutates x and residual):
  // residual <- x + residual; x <- norm(residual). Returns (x, residual). The residual may be f32 with f16/bf16 x (an
  // fp32 residual stream, Mamba-2's residual_in_fp32): the sum is then kept in fp32 and the norm reads it unrounded.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual);

  int64_t hidden_size() const { return hidden_size_; }
  double eps() const { return eps_; }

  Tensor weight;  // [hidden_size]

 private:
  int64_t hidden_size_;
  double eps_;
};

}  // namespace kbn::KBN_VARIANT
