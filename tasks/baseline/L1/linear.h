#pragma once
// The GEMM of vLLM's UnquantizedLinearMethod.apply (F.linear): out = x @ weight^T + bias. On the GPU, through
// cuBLASLt (kbn/cublaslt_linear.h) with the heuristic's algorithm cached per shape; for one token (batch-1 decode), a
// GEMV kernel that streams the weight near the copy rate, where cuBLASLt's kernels reach 50-80% of it on 4096-wide
// projections.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Linear : public Module {
 public:
  Linear() = default;
  // x: [num_tokens, in_features] (row stride may exceed in_features); weight: [out_features, in_features]
  // contiguous; bias: [out_features] or undefined -> new [num_tokens, out_features]
  Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias);
};

}  // namespace kbn::KBN_VARIANT
