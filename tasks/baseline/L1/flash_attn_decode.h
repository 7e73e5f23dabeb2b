#pragma once
// Decode attention over the paged KV cache: one query token per sequence, split along the keys for long
// contexts, GQA-aware (query heads sharing a kv head read it once).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FlashAttnDecode : public Module {
 public:
  FlashAttnDecode(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads);

  // q: [num_seqs, num_heads, head_size]; caches as in FlashAttnPrefill; seq_lens: [num_seqs] i32;
  // block_tables: [num_seqs, max_blocks_per_seq] i32; max_seq_len: host maximum of seq_lens
  // -> new [num_seqs, num_heads, head_size]
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& seq_lens,
                 const Tensor& block_tables, int64_t max_seq_len);

  int64_t num_heads() const { return num_heads_; }
  int64_t head_size() const { return head_size_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  double scale() const { return scale_; }

 private:
  int64_t num_heads_, head_size_, num_kv_heads_;
  double scale_;
};

}  // namespace kbn::KBN_VARIANT
