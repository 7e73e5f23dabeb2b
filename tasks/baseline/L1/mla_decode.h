#pragma once
// Multi-head latent attention decode over the paged latent cache, with the up-projections absorbed (the role of
// FlashMLA's flash_mla_with_kvcache in vLLM's MLA backends): one query token per sequence, every query head attends
// the sequence's cached rows as one shared key head of the row's full width (kv_c_normed | k_pe, 576 values for
// DeepSeek-V2/V3) and takes each row's first kv_lora_rank values (kv_c_normed, 512) as its value:
//   out[b, h] = sum_p softmax_p(scale q[b, h] . row_p) row_p[:kv_lora_rank].
// On the GPU, 16-bit caches of 512 + 64 run a tensor-core split-KV kernel (16 query heads per block share every
// latent row read; on Hopper a producer warp bulk-copies the rows, elsewhere the math warps cp.async them); on Hopper
// 64 or more heads (V3's 128) run FlashMLA's structure instead: 64 heads per block on warpgroup MMAs, the rows copied
// by TMA in 32-row tiles (pages of 8-32 rows dividing 32, or multiples of 32). Other shapes and f32 run the generic
// paged decode kernel (correct, not fast).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MlaDecode : public Module {
 public:
  MlaDecode(int64_t num_heads, int64_t kv_lora_rank, int64_t rope_dim, double scale);

  // q: [num_seqs, num_heads, kv_lora_rank + rope_dim] (last dim contiguous; q_nope absorbed through W_UK, then
  // q_pe); kv_cache: [num_blocks, block_size, kv_lora_rank + rope_dim] contiguous, q's dtype; seq_lens: [num_seqs]
  // i32 (this step's row already stored); block_tables: [num_seqs, max_blocks_per_seq] i32; max_seq_len: the
  // largest seq_lens entry or more (a host value that sizes the split-KV grid)
  // -> new [num_seqs, num_heads, kv_lora_rank]
  Tensor forward(const Tensor& q, const Tensor& kv_cache, const Tensor& seq_lens, const Tensor& block_tables,
                 int64_t max_seq_len);

  int64_t num_heads() const { return num_heads_; }
  int64_t kv_lora_rank() const { return kv_lora_rank_; }
  int64_t rope_dim() const { return rope_dim_; }
  double scale() const { return scale_; }

 private:
  int64_t num_heads_, kv_lora_rank_, rope_dim_;
  double scale_;
};

}  // namespace kbn::KBN_VARIANT
