#pragma once
// Causal varlen attention over the paged KV cache, for prefill and chunked prefill (the role of
// flash_attn_varlen_func with a block table in vLLM's FlashAttention backend). GQA by head grouping.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FlashAttnPrefill : public Module {
 public:
  FlashAttnPrefill(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads);

  // q: [num_tokens, num_heads, head_size]; key_cache, value_cache: [num_blocks, block_size, num_kv_heads,
  // head_size]; query_start_loc: [num_seqs + 1] i32; seq_lens: [num_seqs] i32 (cached + new keys, the new
  // ones already stored); block_tables: [num_seqs, max_blocks_per_seq] i32; max_query_len / max_seq_len:
  // maxima over the batch (host values, used for the launch grid) -> new [num_tokens, num_heads, head_size]
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& query_start_loc,
                 const Tensor& seq_lens, const Tensor& block_tables, int64_t max_query_len, int64_t max_seq_len);

  int64_t num_heads() const { return num_heads_; }
  int64_t head_size() const { return head_size_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  double scale() const { return scale_; }

 private:
  int64_t num_heads_, head_size_, num_kv_heads_;
  double scale_;
};

}  // namespace kbn::KBN_VARIANT
