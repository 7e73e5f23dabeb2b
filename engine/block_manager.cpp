#include "engine/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "kbn/error.h"

namespace kbn::engine {

namespace {

// splitmix64's finaliser: a bijection of 64-bit words that spreads every input bit over the output.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching), blocks_(size_t(std::max<int64_t>(num_blocks, 0))) {
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

int32_t BlockManager::take_free_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = evictable_.front();  // the least recently released cached block gives up its KV
    evictable_.pop_front();
    unregister(b);
  }
  return b;
}

void BlockManager::unregister(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  by_hash_.erase(blk.hash);
  blk.registered = false;
  blk.tokens.clear();
}

void BlockManager::allocate(Sequence& seq, int64_t num_tokens) {
  const int64_t need = blocks_needed(seq, num_tokens);
  KBN_CHECK(need <= num_free_blocks(), "BlockManager: sequence ", seq.id, " needs ", need, " more blocks for ",
            num_tokens, " tokens but only ", num_free_blocks(), " of ", num_blocks(), " are free");
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = take_free_block();
    blocks_[size_t(b)].ref = 1;
    seq.block_table.push_back(b);
  }
}

void BlockManager::free(Sequence& seq) {
  // Reverse order: a released sequence's last blocks are evicted first and its first block is the next
  // never-registered block handed out (keeps reuse local).
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    const int32_t b = *it;
    if (b == kReleasedBlock) continue;  // already back in the pool (release_outside_window)
    KBN_CHECK(b >= 0 && b < num_blocks() && blocks_[size_t(b)].ref > 0, "BlockManager: sequence ", seq.id,
              " releases block ", b, " that no sequence holds");
    release_block(b);
  }
  seq.block_table.clear();
  seq.num_hashed_blocks = 0;
  seq.block_hash = 0;
}

void BlockManager::release_block(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  if (--blk.ref > 0) return;
  if (blk.registered) {
    blk.lru = evictable_.insert(evictable_.end(), b);
  } else {
    free_.push_back(b);
  }
}

int64_t BlockManager::release_outside_window(Sequence& seq, int64_t window) {
  KBN_CHECK(window > 0, "BlockManager: release_outside_window needs a window >= 1, got ", window);
  // Blocks [0, n) hold only keys before seq.num_computed_tokens - window + 1.
  const int64_t first_visible = seq.num_computed_tokens - window + 1;
  const int64_t n = std::min<int64_t>(first_visible > 0 ? first_visible / block_size_ : 0,
                                      int64_t(seq.block_table.size()));
  int64_t released = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = seq.block_table[size_t(i)];
    if (b == kReleasedBlock) continue;
    KBN_CHECK(b >= 0 && b < num_blocks() && blocks_[size_t(b)].ref > 0, "BlockManager: sequence ", seq.id,
              " releases block ", b, " that no sequence holds");
    release_block(b);
    seq.block_table[size_t(i)] = kReleasedBlock;
    ++released;
  }
  return released;
}

uint64_t BlockManager::hash_block(const Sequence& seq, int64_t index, uint64_t parent,
                                  std::vector<int64_t>* tokens) const {
  uint64_t h = mix64(parent ^ 0x6b62'6e61'6e6full);  // "kbnano": the chain's seed, also for the first block
  for (int64_t t = index * block_size_; t < (index + 1) * block_size_; ++t) {
    const int64_t token = seq.token(t);
    h = mix64(h ^ uint64_t(token));
    if (tokens) tokens->push_back(token);
  }
  return h;
}

int32_t BlockManager::lookup(const Sequence& seq, int64_t index, uint64_t hash, uint64_t parent) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Block& blk = blocks_[size_t(it->second)];
  if (blk.parent_hash != parent) return -1;
  for (int64_t j = 0; j < block_size_; ++j)
    if (blk.tokens[size_t(j)] != seq.token(index * block_size_ + j)) return -1;
  return it->second;
}

BlockManager::PrefixMatch BlockManager::match_prefix(const Sequence& seq) const {
  PrefixMatch m;
  if (!prefix_caching_ || by_hash_.empty()) return m;
  const int64_t max_blocks = (seq.num_tokens() - 1) / block_size_;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const uint64_t h = hash_block(seq, i, m.hash, nullptr);
    const int32_t b = lookup(seq, i, h, m.hash);
    if (b < 0) break;
    m.blocks.push_back(b);
    if (blocks_[size_t(b)].ref == 0) m.evictable++;
    m.hash = h;
  }
  return m;
}

void BlockManager::take_prefix(Sequence& seq, const PrefixMatch& match) {
  KBN_CHECK(seq.block_table.empty() && seq.num_computed_tokens == 0, "BlockManager: sequence ", seq.id,
            " takes a cached prefix while holding ", seq.block_table.size(), " blocks and ", seq.num_computed_tokens,
            " computed tokens");
  for (const int32_t b : match.blocks) {
    Block& blk = blocks_[size_t(b)];
    KBN_CHECK(blk.registered, "BlockManager: sequence ", seq.id, " takes block ", b,
              " that is no longer cached (match and take with nothing in between)");
    if (blk.ref++ == 0) evictable_.erase(blk.lru);
    seq.block_table.push_back(b);
  }
  seq.num_hashed_blocks = match.num_blocks();
  seq.block_hash = match.hash;
  seq.num_computed_tokens = match.num_blocks() * block_size_;
}

void BlockManager::cache_full_blocks(Sequence& seq) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(seq.num_computed_tokens / block_size_, int64_t(seq.block_table.size()));
  for (int64_t i = seq.num_hashed_blocks; i < full; ++i) {
    std::vector<int64_t> tokens;
    const uint64_t h = hash_block(seq, i, seq.block_hash, &tokens);
    const int32_t b = seq.block_table[size_t(i)];
    if (b == kReleasedBlock) {  // released before it was registered: the chain still advances
      seq.block_hash = h;
      seq.num_hashed_blocks = i + 1;
      continue;
    }
    Block& blk = blocks_[size_t(b)];
    // A block with the same hash already registered (the same prefix computed twice, or a collision) keeps its
    // place; this one stays an ordinary block and returns to the free list when released.
    if (!blk.registered && by_hash_.find(h) == by_hash_.end()) {
      blk.registered = true;
      blk.hash = h;
      blk.parent_hash = seq.block_hash;
      blk.tokens = std::move(tokens);
      by_hash_.emplace(h, b);
    }
    seq.block_hash = h;
    seq.num_hashed_blocks = i + 1;
  }
}

void BlockManager::check_invariants(const std::vector<const Sequence*>& holders, int64_t window) const {
  std::vector<int> where(size_t(num_blocks()), 0);  // 1 = free list, 2 = evictable list
  for (int32_t b : free_) {
    KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: free list holds block ", b, " outside [0, ",
              num_blocks(), ")");
    KBN_CHECK(where[size_t(b)] == 0, "BlockManager invariant: block ", b, " is on the free list twice");
    const Block& blk = blocks_[size_t(b)];
    KBN_CHECK(blk.ref == 0 && !blk.registered, "BlockManager invariant: block ", b,
              " is on the free list but has ", blk.ref, " holders", blk.registered ? " and is registered" : "");
    where[size_t(b)] = 1;
  }
  for (int32_t b : evictable_) {
    KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: evictable list holds block ", b);
    KBN_CHECK(where[size_t(b)] == 0, "BlockManager invariant: block ", b, " is free or evictable twice");
    const Block& blk = blocks_[size_t(b)];
    KBN_CHECK(blk.ref == 0 && blk.registered && *blk.lru == b, "BlockManager invariant: evictable block ",
              b, " has ", blk.ref, " holders or is not registered");
    where[size_t(b)] = 2;
  }
  for (const auto& [h, b] : by_hash_) {
    KBN_CHECK(b >= 0 && b < num_blocks() && blocks_[size_t(b)].registered && blocks_[size_t(b)].hash == h &&
                  int64_t(blocks_[size_t(b)].tokens.size()) == block_size_,
              "BlockManager invariant: the registration of hash ", h, " points at block ", b, " which does not carry it");
  }
  std::set<int64_t> ids;
  std::map<int32_t, std::vector<std::pair<const Sequence*, int64_t>>> held;  // block -> (holder, index in its table)
  for (const Sequence* s : holders) {
    KBN_CHECK(ids.insert(s->id).second, "BlockManager invariant: sequence id ", s->id, " is listed twice");
    KBN_CHECK(int64_t(s->block_table.size()) >= blocks_for(s->num_computed_tokens), "BlockManager invariant: sequence ",
              s->id, " has ", s->num_computed_tokens, " computed tokens but only ", s->block_table.size(), " blocks");
    std::set<int32_t> own;
    bool leading = true;  // still in the leading run of released entries
    for (size_t i = 0; i < s->block_table.size(); ++i) {
      const int32_t b = s->block_table[i];
      if (b == kReleasedBlock) {
        KBN_CHECK(window > 0, "BlockManager invariant: sequence ", s->id, " has released block ", i,
                  " but the cache has no sliding window");
        KBN_CHECK(leading, "BlockManager invariant: sequence ", s->id, " has released block ", i,
                  " after a held one (only a leading run is released)");
        KBN_CHECK(int64_t(i + 1) * block_size_ <= s->num_computed_tokens - window + 1, "BlockManager invariant: "
                  "sequence ", s->id, " released block ", i, ", which holds keys inside the window of its next token ",
                  "(position ", s->num_computed_tokens, ", window ", window, ")");
        continue;
      }
      leading = false;
      KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: sequence ", s->id, " holds block ", b,
                " outside [0, ", num_blocks(), ")");
      KBN_CHECK(own.insert(b).second, "BlockManager invariant: sequence ", s->id, " lists block ", b, " twice");
      KBN_CHECK(where[size_t(b)] == 0, "BlockManager invariant: block ", b, " is ",
                where[size_t(b)] == 1 ? "free" : "evictable", " and held by sequence ", s->id);
      held[b].push_back({s, int64_t(i)});
    }
  }
  int64_t num_held = 0;
  for (int64_t b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[size_t(b)];
    const auto it = held.find(int32_t(b));
    const int64_t holders_of_b = it == held.end() ? 0 : int64_t(it->second.size());
    if (where[size_t(b)] != 0) continue;
    KBN_CHECK(holders_of_b > 0, "BlockManager invariant: block ", b, " is neither free nor held (leaked, ", blk.ref,
              " recorded holders)");
    KBN_CHECK(blk.ref == holders_of_b, "BlockManager invariant: block ", b, " records ", blk.ref, " holders but ",
              holders_of_b, " sequences list it");
    ++num_held;
    if (holders_of_b < 2) continue;
    // Shared: only a registered block whose tokens every holder has computed and has there.
    KBN_CHECK(blk.registered, "BlockManager invariant: block ", b, " is shared by ", holders_of_b,
              " sequences but is not a registered (cached) block");
    for (const auto& [s, index] : it->second) {
      KBN_CHECK((index + 1) * block_size_ <= s->num_computed_tokens, "BlockManager invariant: shared block ", b,
                " is not full of computed tokens for sequence ", s->id);
      for (int64_t j = 0; j < block_size_; ++j)
        KBN_CHECK(s->token(index * block_size_ + j) == blk.tokens[size_t(j)], "BlockManager invariant: shared block ",
                  b, " holds other tokens than sequence ", s->id, " has at position ", index * block_size_ + j);
    }
  }
  KBN_CHECK(int64_t(free_.size() + evictable_.size()) + num_held == num_blocks(), "BlockManager invariant: ",
            free_.size(), " free + ", evictable_.size(), " evictable + ", num_held, " held != ", num_blocks(), " total");
}

}  // namespace kbn::engine
