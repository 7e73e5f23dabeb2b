#pragma once
// Paged KV-cache blocks (vLLM's PagedAttention): the cache is num_blocks blocks of block_size token slots; a
// sequence owns a list of blocks (its block table) that grows one block at a time as its tokens are computed,
// and gives them all back when it finishes or is preempted. Token t of a sequence lives in slot
// block_table[t / block_size] * block_size + t % block_size.
#include <cstdint>
#include <vector>

#include "engine/sequence.h"

namespace kbn::engine {

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return int64_t(owner_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t num_free_blocks() const { return int64_t(free_.size()); }
  // Blocks that hold num_tokens tokens.
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Blocks `seq` must still get so that its table covers its first num_tokens tokens.
  int64_t blocks_needed(const Sequence& seq, int64_t num_tokens) const;
  bool can_allocate(const Sequence& seq, int64_t num_tokens) const;
  // Grows seq.block_table to cover num_tokens tokens; throws when too few blocks are free (ask can_allocate).
  void allocate(Sequence& seq, int64_t num_tokens);
  // Returns every block of `seq` to the free list and clears its table.
  void free(Sequence& seq);

  // Throws naming the first broken invariant: every block is either free (once) or owned by exactly one of
  // `holders` (the sequences that may hold blocks: waiting and running ones), owners match the holders'
  // tables, and free + used = total.
  void check_invariants(const std::vector<const Sequence*>& holders) const;

 private:
  int64_t block_size_;
  std::vector<int32_t> free_;   // a stack: the most recently freed block is reused first
  std::vector<int64_t> owner_;  // sequence id of each used block
  std::vector<bool> used_;      // kept apart from owner_: sequence ids may be any int64, so none means "free"
};

}  // namespace kbn::engine
