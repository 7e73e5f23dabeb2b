#pragma once
// ReplicatedLinear (vLLM vllm/model_executor/layers/linear.py): every tensor-parallel rank holds the whole weight
// and computes the whole output; the MoE blocks' routers (gate: hidden_size -> num_experts). Weight [out, in] like
// PyTorch; forward returns (output, output_bias) as the parallel linears do (L2/parallel_linear.h).
#include <string>
#include <utility>

#include "L1/linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class ReplicatedLinear : public Module {
 public:
  ReplicatedLinear(int64_t input_size, int64_t output_size, bool bias, bool skip_bias_add, const ParamOptions& opts,
                   const std::string& prefix = "");

  // x: [num_tokens, input_size] -> ([num_tokens, output_size], bias or undefined)
  std::pair<Tensor, Tensor> forward(const Tensor& x);

  Tensor weight;  // [output_size, input_size]
  Tensor bias;    // [output_size] when bias

 private:
  int64_t input_size_, output_size_;
  bool skip_bias_add_;
  Linear linear_;
};

}  // namespace kbn::KBN_VARIANT
