#include "engine/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "kbn/error.h"

namespace kbn::engine {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size)
    : block_size_(block_size),
      owner_(size_t(std::max<int64_t>(num_blocks, 0)), 0),
      used_(size_t(std::max<int64_t>(num_blocks, 0)), false) {
  KBN_CHECK(num_blocks > 0, "BlockManager: num_blocks must be >= 1, got ", num_blocks);
  KBN_CHECK(block_size > 0, "BlockManager: block_size must be >= 1, got ", block_size);
  KBN_CHECK(num_blocks <= INT32_MAX, "BlockManager: block tables are i32; ", num_blocks, " blocks is too many");
  free_.reserve(size_t(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));  // block 0 is handed out first
}

int64_t BlockManager::blocks_needed(const Sequence& seq, int64_t num_tokens) const {
  return std::max<int64_t>(0, blocks_for(num_tokens) - int64_t(seq.block_table.size()));
}

bool BlockManager::can_allocate(const Sequence& seq, int64_t num_tokens) const {
  return blocks_needed(seq, num_tokens) <= num_free_blocks();
}

void BlockManager::allocate(Sequence& seq, int64_t num_tokens) {
  const int64_t need = blocks_needed(seq, num_tokens);
  KBN_CHECK(need <= num_free_blocks(), "BlockManager: sequence ", seq.id, " needs ", need, " more blocks for ",
            num_tokens, " tokens but only ", num_free_blocks(), " of ", num_blocks(), " are free");
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    used_[size_t(b)] = true;
    owner_[size_t(b)] = seq.id;
    seq.block_table.push_back(b);
  }
}

void BlockManager::free(Sequence& seq) {
  // Reverse order, so that the sequence's first block is the next one handed out (keeps reuse local).
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    const int32_t b = *it;
    KBN_CHECK(b >= 0 && b < num_blocks() && used_[size_t(b)] && owner_[size_t(b)] == seq.id, "BlockManager: sequence ",
              seq.id, " frees block ", b, " that it does not own");
    used_[size_t(b)] = false;
    free_.push_back(b);
  }
  seq.block_table.clear();
}

void BlockManager::check_invariants(const std::vector<const Sequence*>& holders) const {
  std::vector<int> seen(size_t(num_blocks()), 0);  // 1 = free list, 2 = some holder's table
  for (int32_t b : free_) {
    KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: free list holds block ", b, " outside [0, ",
              num_blocks(), ")");
    KBN_CHECK(seen[size_t(b)] == 0, "BlockManager invariant: block ", b, " is on the free list twice");
    KBN_CHECK(!used_[size_t(b)], "BlockManager invariant: block ", b, " is on the free list but marked used");
    seen[size_t(b)] = 1;
  }
  std::set<int64_t> ids;
  int64_t in_tables = 0;
  for (const Sequence* s : holders) {
    KBN_CHECK(ids.insert(s->id).second, "BlockManager invariant: sequence id ", s->id, " is listed twice");
    KBN_CHECK(int64_t(s->block_table.size()) >= blocks_for(s->num_computed_tokens), "BlockManager invariant: sequence ",
              s->id, " has ", s->num_computed_tokens, " computed tokens but only ", s->block_table.size(), " blocks");
    for (int32_t b : s->block_table) {
      KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: sequence ", s->id, " holds block ", b,
                " outside [0, ", num_blocks(), ")");
      KBN_CHECK(seen[size_t(b)] != 1, "BlockManager invariant: block ", b, " is free and held by sequence ", s->id);
      KBN_CHECK(seen[size_t(b)] != 2, "BlockManager invariant: block ", b, " is held twice (again by sequence ", s->id,
                ")");
      KBN_CHECK(used_[size_t(b)] && owner_[size_t(b)] == s->id, "BlockManager invariant: block ", b, " is in sequence ",
                s->id, "'s table but recorded as ",
                used_[size_t(b)] ? "owned by " + std::to_string(owner_[size_t(b)]) : std::string("free"));
      seen[size_t(b)] = 2;
      ++in_tables;
    }
  }
  for (int64_t b = 0; b < num_blocks(); ++b)
    KBN_CHECK(seen[size_t(b)] != 0, "BlockManager invariant: block ", b, " is neither free nor held (leaked",
              used_[size_t(b)] ? " by sequence " + std::to_string(owner_[size_t(b)]) : std::string(""), ")");
  KBN_CHECK(num_free_blocks() + in_tables == num_blocks(), "BlockManager invariant: ", num_free_blocks(), " free + ",
            in_tables, " used != ", num_blocks(), " total");
}

}  // namespace kbn::engine
