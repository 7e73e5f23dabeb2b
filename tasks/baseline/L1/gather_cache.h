#pragma once
// The rows of each sequence's paged-cache pages in position order (vLLM's cp_gather_cache, used by its MLA prefill
// to decompress a context's latent rows through kv_b_proj), one fixed-length slot per sequence:
// out[i, j] = sequence i's row at position j for j < seq_lens[i], zeros past it.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GatherCache : public Module {
 public:
  GatherCache() = default;
  // kv_cache: [num_blocks, block_size, width] contiguous; block_tables: [num_seqs, max_blocks_per_seq] i32;
  // seq_lens: [num_seqs] i32; max_seq_len: the slot length, at least every seq_lens entry (a host value)
  // -> new [num_seqs, max_seq_len, width] of kv_cache's dtype. On the GPU a length outside [0, max_seq_len] or a
  // block outside the cache is reported through kbn/device_errors.h (that sequence's slot is left zero).
  Tensor forward(const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len);
};

}  // namespace kbn::KBN_VARIANT
