#pragma once
// Embedding gather, the kernel inside vLLM's VocabParallelEmbedding: rows of this rank's vocabulary
// shard [vocab_start, vocab_end); ids outside it give zero rows (summed across ranks by an all-reduce).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Embedding : public Module {
 public:
  Embedding() = default;
  // input_ids: [num_tokens] (i32 or i64); weight: [vocab_end - vocab_start, hidden] -> new [num_tokens, hidden].
  // With vocab_start = 0 and vocab_end = weight rows (one rank), an id outside [0, vocab) is an error on CPU;
  // the CUDA kernel cannot raise, so it writes zeros for such ids (the engine validates ids on entry).
  Tensor forward(const Tensor& input_ids, const Tensor& weight, int64_t vocab_start, int64_t vocab_end);
  // The rows times `scale` (Gemma's embedding normaliser sqrt(hidden_size)): the scale is rounded to the weight's
  // dtype and each product to the dtype, as `embedding(ids) * normalizer.to(dtype)` computes it in PyTorch.
  Tensor forward(const Tensor& input_ids, const Tensor& weight, int64_t vocab_start, int64_t vocab_end, double scale);
};

}  // namespace kbn::KBN_VARIANT
