#pragma once
// The one builder of a step's attention metadata (DESIGN.md: "one builder makes each step's metadata for the
// runner, the graphs and the bench"). Given each sequence's cached and new token counts and its block table,
// prefills first, it computes the positions, KV slots, query starts, sequence lengths, padded block tables and
// launch maxima on the host (StepLayout), and uploads them as an AttentionMetadata. The engine's model runner,
// its CUDA-graph runner (which copies the layout into its pinned staging buffers), batched greedy generation and
// the kernel bench's block cases all build their steps through it.
#include <cstdint>
#include <vector>

#include "kbn/forward_context.h"

namespace kbn {

// One sequence of a step: tokens [num_computed, num_computed + num_new) are fed now; the cache already holds the
// first num_computed. A prefill (or prefill chunk) gets a query_start_loc entry; a decode feeds one token.
struct StepSequence {
  int64_t num_computed = 0;
  int64_t num_new = 0;
  const std::vector<int32_t>* block_table = nullptr;  // the sequence's blocks, at least covering its tokens
  bool prefill = false;
  int32_t state_slot = -1;  // its recurrent-state slot (models with state layers), else -1
  // KV cache groups 1.. (kbn::KVCacheGroups), each table like block_table; null or empty: one group. Every
  // sequence of a step has the same number of tables. A table entry of -1 (a block a sliding group released) is
  // written as block 0: no kernel reads a page before its window.
  const std::vector<std::vector<int32_t>>* more_block_tables = nullptr;
};

struct StepLayout {
  std::vector<int64_t> positions;        // [num_tokens]
  std::vector<int64_t> slot_mapping;     // [num_tokens]
  std::vector<int32_t> query_start_loc;  // [num_prefills + 1]
  std::vector<int32_t> seq_lens;         // [num_seqs]: cached + new
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks], rows padded with block 0
  // KV cache groups 1..: their slot mappings and block tables, shaped as the two above (which are group 0's).
  std::vector<std::vector<int64_t>> more_slot_mappings;
  std::vector<std::vector<int32_t>> more_block_tables;
  int64_t max_blocks = 1;
  int64_t num_prefills = 0, num_prefill_tokens = 0, num_decodes = 0;
  int64_t max_prefill_query_len = 0, max_prefill_seq_len = 0, max_decode_seq_len = 0;
  // [num_seqs] each when the sequences hold state slots (all or none of them), else empty.
  std::vector<int32_t> state_indices, has_initial_state;
  int64_t num_tokens() const { return int64_t(positions.size()); }
  int64_t num_kv_groups() const { return 1 + int64_t(more_block_tables.size()); }
};

// Prefills must come first; every sequence's blocks must cover its tokens (the error names the sequence).
StepLayout build_step_layout(const std::vector<StepSequence>& seqs, int64_t block_size);

// The layout as device tensors.
AttentionMetadata upload_step_metadata(const StepLayout& layout, Device device);

}  // namespace kbn
