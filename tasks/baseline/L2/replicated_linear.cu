#include "L2/replicated_linear.h"

#include "kbn/checks.h"

namespace kbn::KBN_VARIANT {

ReplicatedLinear::ReplicatedLinear(int64_t input_size, int64_t output_size, bool bias, bool skip_bias_add,
                                   const ParamOptions& opts, const std::string& prefix)
    : input_size_(input_size), output_size_(output_size), skip_bias_add_(skip_bias_add) {
  KBN_CHECK(input_size > 0 && output_size > 0, "ReplicatedLinear ", prefix, ": sizes must be positive, got ",
            input_size, " -> ", output_size);
  weight = Tensor::empty({output_size, input_size}, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::normal);
  if (bias) {
    this->bias = Tensor::empty({output_size}, opts.dtype, opts.device);
    register_parameter("bias", &this->bias, InitKind::zeros);
  }
}

std::pair<Tensor, Tensor> ReplicatedLinear::forward(const Tensor& x) {
  check_rank(x, "ReplicatedLinear", "x", 2, "[num_tokens, input_size]");
  check_size(x, "ReplicatedLinear", "x", 1, input_size_, "input_size");
  Tensor b = bias.defined() && !skip_bias_add_ ? bias : Tensor();
  Tensor out = linear_.forward(x, weight, b);
  return {out, skip_bias_add_ ? bias : Tensor()};
}

}  // namespace kbn::KBN_VARIANT
