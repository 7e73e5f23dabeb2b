#pragma once
// Greedy sampling: the index of the largest logit per row (lowest index on ties; NaN never wins).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Argmax : public Module {
 public:
  Argmax() = default;
  // logits: [num_tokens, vocab] (f32, f16 or bf16; row stride may exceed vocab) -> new [num_tokens] i64
  Tensor forward(const Tensor& logits);
};

}  // namespace kbn::KBN_VARIANT
