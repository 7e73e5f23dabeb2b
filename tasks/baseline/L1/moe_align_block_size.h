#pragma once
// vLLM moe_align_block_size: the (token, expert) pairs of a routing grouped by expert, each expert's group padded
// to a multiple of block_size, so every block of block_size rows of the expert GEMM belongs to one expert.
// Pair p = t * top_k + j is topk_ids[t, j]'s pair. Outputs (all i32, every element defined, so results compare
// exactly):
//   sorted_token_ids [max_padded]: expert 0's pairs in increasing p, then padding up to a block boundary, then
//     expert 1's, ...; padding and everything past num_tokens_post_padded hold num_tokens * top_k.
//   expert_ids [max_padded / block_size]: the expert of each block; num_experts (one past the experts, as the padding
//     of sorted_token_ids is one past the pairs) for blocks past num_tokens_post_padded.
//   num_tokens_post_padded [1]: the padded pair count (a multiple of block_size).
// max_padded = round_up(num_tokens * top_k + num_experts * (block_size - 1), block_size), fixed by the shapes, so
// the call needs no host sync and can be captured in a CUDA graph. An expert id outside [0, num_experts) is an
// error on CPU tensors and is dropped (its pair appears nowhere) on the GPU.
#include <tuple>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MoeAlignBlockSize : public Module {
 public:
  MoeAlignBlockSize(int64_t block_size, int64_t num_experts);
  // topk_ids: [num_tokens, top_k] i32 contiguous -> (sorted_token_ids, expert_ids, num_tokens_post_padded), new
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& topk_ids);

  // The sizes of the outputs for num_pairs = num_tokens * top_k.
  static int64_t max_padded(int64_t num_pairs, int64_t block_size, int64_t num_experts);

  int64_t block_size() const { return block_size_; }
  int64_t num_experts() const { return num_experts_; }

 private:
  int64_t block_size_, num_experts_;
};

}  // namespace kbn::KBN_VARIANT
