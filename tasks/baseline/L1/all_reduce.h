#pragma once
// tensor_model_parallel_all_reduce: sums x across the tensor-parallel group (kbn::parallel_state()).
// With tp_size 1 it returns x untouched.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class AllReduce : public Module {
 public:
  AllReduce() = default;
  // x: any shape, contiguous. Mutates x (in-place sum); returns it.
  Tensor forward(const Tensor& x);
};

}  // namespace kbn::KBN_VARIANT
