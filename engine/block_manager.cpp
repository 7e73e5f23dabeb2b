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

int64_t max_blocks_held(const std::vector<int64_t>& group_windows, int64_t block_size, int64_t max_len,
                        int64_t max_chunk) {
  KBN_CHECK(block_size >= 1 && max_len >= 0 && max_chunk >= 1, "max_blocks_held: need block_size >= 1, max_len >= 0 ",
            "and max_chunk >= 1, got ", block_size, ", ", max_len, " and ", max_chunk);
  const auto blocks_for = [&](int64_t tokens) { return (tokens + block_size - 1) / block_size; };
  int64_t n = 0;
  for (const int64_t w : group_windows) {
    // A sliding group holds the blocks of keys [c - w + 1, c + chunk): at most blocks_for(chunk + w - 1) + 1.
    n += w == 0 ? blocks_for(max_len) : std::min(blocks_for(max_len), blocks_for(max_chunk + w - 1) + 1);
  }
  return n;
}

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching,
                           std::vector<int64_t> group_windows)
    : block_size_(block_size),
      prefix_caching_(prefix_caching),
      windows_(std::move(group_windows)),
      blocks_(size_t(std::max<int64_t>(num_blocks, 0))) {
  KBN_CHECK(num_blocks > 0, "BlockManager: num_blocks must be >= 1, got ", num_blocks);
  KBN_CHECK(block_size > 0, "BlockManager: block_size must be >= 1, got ", block_size);
  KBN_CHECK(num_blocks <= INT32_MAX, "BlockManager: block tables are i32; ", num_blocks, " blocks is too many");
  KBN_CHECK(!windows_.empty(), "BlockManager: group_windows needs one window per KV cache group (0: full), got none");
  for (size_t g = 0; g < windows_.size(); ++g)
    KBN_CHECK(windows_[g] >= 0, "BlockManager: group_windows[", g, "] must be >= 0 (0: full attention), got ",
              windows_[g]);
  free_.reserve(size_t(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));  // block 0 is handed out first
}

const std::vector<int32_t>& BlockManager::table(const Sequence& seq, int64_t group) {
  if (group == 0) return seq.block_table;
  KBN_CHECK(group <= int64_t(seq.more_block_tables.size()), "BlockManager: sequence ", seq.id, " has no table for ",
            "KV cache group ", group, " (", seq.more_block_tables.size() + 1, " tables)");
  return seq.more_block_tables[size_t(group - 1)];
}

std::vector<int32_t>& BlockManager::mutable_table(Sequence& seq, int64_t group) {
  if (int64_t(seq.more_block_tables.size()) < num_groups() - 1) seq.more_block_tables.resize(size_t(num_groups() - 1));
  return group == 0 ? seq.block_table : seq.more_block_tables[size_t(group - 1)];
}

int64_t BlockManager::first_visible_block(int64_t group, int64_t position) const {
  const int64_t w = windows_[size_t(group)];
  if (w == 0) return 0;
  const int64_t first_key = position - w + 1;
  return first_key > 0 ? first_key / block_size_ : 0;
}

int64_t BlockManager::blocks_needed(const Sequence& seq, int64_t num_tokens) const {
  // Every table has block_table's length (allocate grows them together).
  return num_groups() * std::max<int64_t>(0, blocks_for(num_tokens) - int64_t(seq.block_table.size()));
}

bool BlockManager::can_allocate(const Sequence& seq, int64_t num_tokens) const {
  return blocks_needed(seq, num_tokens) <= num_free_blocks();
}

int64_t BlockManager::drain_to_finish(int64_t group, int64_t held, int64_t shared, int64_t table_blocks,
                                      int64_t final_len, int64_t max_chunk) const {
  const int64_t w = windows_[size_t(group)];
  const int64_t growth = std::max<int64_t>(0, blocks_for(final_len) - table_blocks);  // blocks it will still take
  if (w == 0) return growth;
  // A sliding group holds at most the blocks of a step's tokens and the window before it (max_blocks_held's bound);
  // what it gives back meanwhile returns to the pool, except its shared blocks, which another holder may keep.
  const int64_t peak = std::min(blocks_for(final_len), blocks_for(std::max<int64_t>(max_chunk, 1) + w - 1) + 1);
  return std::clamp<int64_t>(peak - (held - shared), 0, growth);
}

int64_t BlockManager::blocks_to_finish(const Sequence& seq, int64_t final_len, int64_t max_chunk) const {
  int64_t n = 0;
  for (int64_t g = 0; g < num_groups(); ++g) {
    int64_t held = 0, shared = 0;
    if (!seq.block_table.empty())
      for (const int32_t b : table(seq, g)) {
        held += b >= 0;
        shared += b >= 0 && blocks_[size_t(b)].ref > 1;
      }
    n += drain_to_finish(g, held, shared, int64_t(seq.block_table.size()), final_len, max_chunk);
  }
  return n;
}

int64_t BlockManager::blocks_to_finish(const PrefixMatch& match, int64_t table_blocks, int64_t final_len,
                                       int64_t max_chunk) const {
  int64_t n = 0;
  for (int64_t g = 0; g < num_groups(); ++g) {
    int64_t held = table_blocks - match.num, shared = 0;  // the new blocks are its own
    if (match.num > 0)
      for (const int32_t b : match.blocks[size_t(g)]) {
        held += b >= 0;
        shared += b >= 0 && blocks_[size_t(b)].ref > 0;  // held by another sequence now
      }
    n += drain_to_finish(g, held, shared, table_blocks, final_len, max_chunk);
  }
  return n;
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
  const int64_t target = blocks_for(num_tokens);
  for (int64_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& t = mutable_table(seq, g);
    while (int64_t(t.size()) < target) {
      const int32_t b = take_free_block();
      blocks_[size_t(b)].ref = 1;
      t.push_back(b);
    }
  }
}

void BlockManager::free(Sequence& seq) {
  // Reverse order: a released sequence's last blocks are evicted first and its first block is the next
  // never-registered block handed out (keeps reuse local).
  for (int64_t g = num_groups() - 1; g >= 0; --g) {
    std::vector<int32_t>& t = mutable_table(seq, g);
    for (auto it = t.rbegin(); it != t.rend(); ++it) {
      const int32_t b = *it;
      if (b == kReleasedBlock) continue;  // already back in the pool (release_outside_windows)
      KBN_CHECK(b >= 0 && b < num_blocks() && blocks_[size_t(b)].ref > 0, "BlockManager: sequence ", seq.id,
                " releases block ", b, " that no sequence holds");
      release_block(b);
    }
    t.clear();
  }
  seq.more_block_tables.clear();
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

int64_t BlockManager::release_outside_windows(Sequence& seq) {
  int64_t released = 0;
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (windows_[size_t(g)] == 0) continue;
    std::vector<int32_t>& t = mutable_table(seq, g);
    // Blocks [0, n) hold only keys before seq.num_computed_tokens - window + 1.
    const int64_t n = std::min<int64_t>(first_visible_block(g, seq.num_computed_tokens), int64_t(t.size()));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t b = t[size_t(i)];
      if (b == kReleasedBlock) continue;
      KBN_CHECK(b >= 0 && b < num_blocks() && blocks_[size_t(b)].ref > 0, "BlockManager: sequence ", seq.id,
                " releases block ", b, " that no sequence holds");
      release_block(b);
      t[size_t(i)] = kReleasedBlock;
      ++released;
    }
  }
  return released;
}

uint64_t BlockManager::group_key(int64_t group, uint64_t h) {
  return group == 0 ? h : mix64(h ^ (0xa24b'aed4'963e'e407ull * uint64_t(group)));
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

int32_t BlockManager::lookup(const Sequence& seq, int64_t index, int64_t group, uint64_t hash, uint64_t parent) const {
  const auto it = by_hash_.find(group_key(group, hash));
  if (it == by_hash_.end()) return -1;
  const Block& blk = blocks_[size_t(it->second)];
  if (blk.parent_hash != parent || blk.group != group) return -1;
  for (int64_t j = 0; j < block_size_; ++j)
    if (blk.tokens[size_t(j)] != seq.token(index * block_size_ + j)) return -1;
  return it->second;
}

BlockManager::PrefixMatch BlockManager::match_prefix(const Sequence& seq) const {
  PrefixMatch m;
  m.blocks.resize(size_t(num_groups()));
  if (!prefix_caching_ || by_hash_.empty()) return m;
  const int64_t max_blocks = (seq.num_tokens() - 1) / block_size_;
  // The chain hashes and each group's cached block per index; a full group's first miss bounds the match.
  std::vector<uint64_t> chain{0};
  std::vector<std::vector<int32_t>> hit(static_cast<size_t>(num_groups()));
  int64_t bound = max_blocks;
  for (int64_t i = 0; i < bound; ++i) {
    const uint64_t h = hash_block(seq, i, chain.back(), nullptr);
    for (int64_t g = 0; g < num_groups(); ++g) {
      const int32_t b = lookup(seq, i, g, h, chain.back());
      hit[size_t(g)].push_back(b);
      if (b < 0 && windows_[size_t(g)] == 0) bound = std::min(bound, i);
    }
    chain.push_back(h);
  }
  // The longest prefix whose next token finds, in every sliding group, the blocks its window reaches.
  int64_t n = bound;
  for (; n > 0; --n) {
    bool ok = true;
    for (int64_t g = 0; g < num_groups() && ok; ++g) {
      if (windows_[size_t(g)] == 0) continue;
      for (int64_t i = first_visible_block(g, n * block_size_); i < n && ok; ++i) ok = hit[size_t(g)][size_t(i)] >= 0;
    }
    if (ok) break;
  }
  if (n == 0) return m;
  m.num = n;
  m.hash = chain[size_t(n)];
  for (int64_t g = 0; g < num_groups(); ++g) {
    const int64_t first = first_visible_block(g, n * block_size_);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t b = i < first ? kReleasedBlock : hit[size_t(g)][size_t(i)];
      m.blocks[size_t(g)].push_back(b);
      if (b >= 0 && blocks_[size_t(b)].ref == 0) m.evictable++;
    }
  }
  return m;
}

void BlockManager::take_prefix(Sequence& seq, const PrefixMatch& match) {
  KBN_CHECK(seq.block_table.empty() && seq.num_computed_tokens == 0, "BlockManager: sequence ", seq.id,
            " takes a cached prefix while holding ", seq.block_table.size(), " blocks and ", seq.num_computed_tokens,
            " computed tokens");
  if (match.num == 0) return;
  KBN_CHECK(int64_t(match.blocks.size()) == num_groups(), "BlockManager: a prefix match of ", match.blocks.size(),
            " groups for a cache of ", num_groups());
  for (int64_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& t = mutable_table(seq, g);
    for (const int32_t b : match.blocks[size_t(g)]) {
      t.push_back(b);
      if (b == kReleasedBlock) continue;
      Block& blk = blocks_[size_t(b)];
      KBN_CHECK(blk.registered, "BlockManager: sequence ", seq.id, " takes block ", b,
                " that is no longer cached (match and take with nothing in between)");
      if (blk.ref++ == 0) evictable_.erase(blk.lru);
    }
  }
  seq.num_hashed_blocks = match.num;
  seq.block_hash = match.hash;
  seq.num_computed_tokens = match.num * block_size_;
}

void BlockManager::cache_full_blocks(Sequence& seq) {
  if (!prefix_caching_) return;
  // Only tokens whose ids are known are hashed (async scheduling: a pending token's KV may be computed already).
  const int64_t full = std::min<int64_t>(std::min(seq.num_computed_tokens, seq.num_known_tokens()) / block_size_,
                                         int64_t(seq.block_table.size()));
  for (int64_t i = seq.num_hashed_blocks; i < full; ++i) {
    std::vector<int64_t> tokens;
    const uint64_t h = hash_block(seq, i, seq.block_hash, &tokens);
    for (int64_t g = 0; g < num_groups(); ++g) {
      const int32_t b = mutable_table(seq, g)[size_t(i)];
      if (b == kReleasedBlock) continue;  // released before it was registered: the chain still advances
      Block& blk = blocks_[size_t(b)];
      // A block with the same key already registered (the same prefix computed twice, or a collision) keeps its
      // place; this one stays an ordinary block and returns to the free list when released.
      const uint64_t key = group_key(g, h);
      if (!blk.registered && by_hash_.find(key) == by_hash_.end()) {
        blk.registered = true;
        blk.group = int32_t(g);
        blk.hash = key;
        blk.parent_hash = seq.block_hash;
        blk.tokens = tokens;
        by_hash_.emplace(key, b);
      }
    }
    seq.block_hash = h;
    seq.num_hashed_blocks = i + 1;
  }
}

void BlockManager::check_invariants(const std::vector<const Sequence*>& holders) const {
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
                  int64_t(blocks_[size_t(b)].tokens.size()) == block_size_ && blocks_[size_t(b)].group >= 0 &&
                  blocks_[size_t(b)].group < num_groups(),
              "BlockManager invariant: the registration of hash ", h, " points at block ", b,
              " which does not carry it");
  }
  std::set<int64_t> ids;
  struct Holding {
    const Sequence* seq;
    int64_t group, index;
  };
  std::map<int32_t, std::vector<Holding>> held;  // block -> where holders list it
  for (const Sequence* s : holders) {
    KBN_CHECK(ids.insert(s->id).second, "BlockManager invariant: sequence id ", s->id, " is listed twice");
    KBN_CHECK(int64_t(s->block_table.size()) >= blocks_for(s->num_computed_tokens), "BlockManager invariant: sequence ",
              s->id, " has ", s->num_computed_tokens, " computed tokens but only ", s->block_table.size(), " blocks");
    KBN_CHECK(s->more_block_tables.empty() || int64_t(s->more_block_tables.size()) == num_groups() - 1,
              "BlockManager invariant: sequence ", s->id, " has ", s->more_block_tables.size() + 1,
              " block tables for ", num_groups(), " KV cache groups");
    std::set<int32_t> own;
    for (int64_t g = 0; g < num_groups(); ++g) {
      if (g > 0 && s->more_block_tables.empty()) {
        KBN_CHECK(s->block_table.empty(), "BlockManager invariant: sequence ", s->id, " holds ", s->block_table.size(),
                  " blocks in group 0 but has no table for group ", g);
        continue;
      }
      const std::vector<int32_t>& t = table(*s, g);
      KBN_CHECK(t.size() == s->block_table.size(), "BlockManager invariant: sequence ", s->id, "'s table of group ", g,
                " has ", t.size(), " blocks, group 0's ", s->block_table.size());
      const int64_t window = windows_[size_t(g)];
      bool leading = true;  // still in the leading run of released entries
      for (size_t i = 0; i < t.size(); ++i) {
        const int32_t b = t[i];
        if (b == kReleasedBlock) {
          KBN_CHECK(window > 0, "BlockManager invariant: sequence ", s->id, " has released block ", i, " of group ", g,
                    ", which has no sliding window");
          KBN_CHECK(leading, "BlockManager invariant: sequence ", s->id, " has released block ", i, " of group ", g,
                    " after a held one (only a leading run is released)");
          KBN_CHECK(int64_t(i + 1) * block_size_ <= s->num_computed_tokens - window + 1,
                    "BlockManager invariant: ", "sequence ", s->id, " released block ", i, " of group ", g,
                    ", which holds keys inside the window ", "of its next token (position ", s->num_computed_tokens,
                    ", window ", window, ")");
          continue;
        }
        leading = false;
        KBN_CHECK(b >= 0 && b < num_blocks(), "BlockManager invariant: sequence ", s->id, " holds block ", b,
                  " outside [0, ", num_blocks(), ")");
        KBN_CHECK(own.insert(b).second, "BlockManager invariant: sequence ", s->id, " lists block ", b, " twice");
        KBN_CHECK(where[size_t(b)] == 0, "BlockManager invariant: block ", b, " is ",
                  where[size_t(b)] == 1 ? "free" : "evictable", " and held by sequence ", s->id);
        held[b].push_back({s, g, int64_t(i)});
      }
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
    // Shared: only a registered block whose tokens every holder has computed and has there, in its group's table.
    KBN_CHECK(blk.registered, "BlockManager invariant: block ", b, " is shared by ", holders_of_b,
              " sequences but is not a registered (cached) block");
    for (const auto& [s, group, index] : it->second) {
      KBN_CHECK(group == blk.group, "BlockManager invariant: shared block ", b, " of group ", blk.group,
                " is listed in sequence ", s->id, "'s table of group ", group);
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
