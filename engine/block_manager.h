#pragma once
// Paged KV-cache blocks (vLLM's PagedAttention): the cache is num_blocks blocks of block_size token slots; a
// sequence holds a list of blocks (its block table) that grows one block at a time as its tokens are computed,
// and gives them back when it finishes or is preempted. Token t of a sequence lives in slot
// block_table[t / block_size] * block_size + t % block_size.
//
// With prefix caching (vLLM V1's automatic prefix caching, on by default there and in EngineConfig), a block whose
// block_size tokens are all computed is registered under a hash of its tokens chained with the hash of the blocks
// before it: its KV is a function of that token prefix alone. A sequence admitted later whose leading tokens are
// the same takes those blocks instead of computing them (shared, reference-counted). A block no sequence holds
// any more keeps its KV and its registration until its slot is needed: allocation takes never-registered free
// blocks first, then evicts the least recently released cached block (a released sequence's last block first).
// A preempted sequence that comes back soon finds most of its own blocks still cached.
// NOTE: lookups compare the block's tokens and its parent's hash as well as its own hash, so a false hit needs a
// 64-bit hash collision of the parent chain with identical block tokens.
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "engine/sequence.h"

namespace kbn::engine {

// The most blocks one sequence of up to max_len tokens holds at once, over the KV cache groups of `group_windows`
// (0: full attention), when its prefill runs in chunks of at most max_chunk tokens: a full group's table covers
// every token, a sliding group's only a chunk and the window before it.
int64_t max_blocks_held(const std::vector<int64_t>& group_windows, int64_t block_size, int64_t max_len,
                        int64_t max_chunk);

// KV cache groups (vLLM's hybrid KV cache manager; kbn::KVCacheGroups): a model whose attention layers see
// different windows (gpt-oss: 128-key sliding layers between full ones; Gemma-3: 1024-key local layers) keeps one
// block table per group of layers with the same window, every table indexing one pool of blocks. Group 0's table is
// Sequence::block_table, group g's Sequence::more_block_tables[g - 1]; all of a sequence's tables have the same
// length (a block per block_size tokens). A group whose window is 0 keeps every block; a sliding group gives its
// blocks wholly before the window of the sequence's next token back to the pool (release_outside_windows), so a long
// sequence costs window-sized memory on its sliding layers. A model with one window (or none) has one group.
class BlockManager {
 public:
  // group_windows: the sliding window of each KV cache group (0: full attention); one group by default.
  BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching = false,
               std::vector<int64_t> group_windows = {0});

  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t num_groups() const { return int64_t(windows_.size()); }
  // Blocks an allocation can take: never-registered free blocks plus cached blocks no sequence holds.
  int64_t num_free_blocks() const { return int64_t(free_.size() + evictable_.size()); }
  // Registered blocks (held or not), i.e. how many blocks of KV the prefix cache can serve.
  int64_t num_cached_blocks() const { return int64_t(by_hash_.size()); }
  // Blocks that hold num_tokens tokens (in one group's table).
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Blocks `seq` must still get, over all groups, so that its tables cover its first num_tokens tokens.
  int64_t blocks_needed(const Sequence& seq, int64_t num_tokens) const;
  bool can_allocate(const Sequence& seq, int64_t num_tokens) const;
  // Grows every table of seq to cover num_tokens tokens; throws when too few blocks are free (ask can_allocate).
  void allocate(Sequence& seq, int64_t num_tokens);
  // Releases every block of `seq` and clears its tables (and its prefix-hash state).
  void free(Sequence& seq);
  // engine::max_blocks_held over this manager's groups.
  int64_t max_blocks_held(int64_t max_len, int64_t max_chunk) const {
    return engine::max_blocks_held(windows_, block_size_, max_len, max_chunk);
  }

  // Sliding groups (vLLM's SlidingWindowManager): the leading blocks of `seq` whose every slot lies before the
  // window of the next token it computes (position num_computed_tokens: it sees keys num_computed_tokens - window +
  // 1 on) are never read again by that group's layers; they go back to the pool (a cached block stays cached, and
  // evictable once no sequence holds it) and their table entries become kReleasedBlock. The attention kernels never
  // read a page before a window, and the step metadata writes block 0 for such entries. Call after
  // cache_full_blocks, so that released blocks were registered first. Returns how many blocks were released.
  static constexpr int32_t kReleasedBlock = -1;
  int64_t release_outside_windows(Sequence& seq);

  // Prefix caching. The leading full blocks of a sequence that holds no blocks whose KV is cached: at most
  // (num_tokens - 1) / block_size of them, so that the last token is always computed (a step samples from it). A
  // full group needs every one of them cached, a sliding group only those its window reaches from the first token
  // left to compute.
  struct PrefixMatch {
    std::vector<std::vector<int32_t>> blocks;  // per group, num_blocks() entries (kReleasedBlock: not needed)
    int64_t evictable = 0;                     // of those, held by no sequence (they count in num_free_blocks)
    uint64_t hash = 0;                         // the chain hash after the last of them
    int64_t num = 0;                           // leading blocks (per table) matched
    int64_t num_blocks() const { return num; }
  };
  // At most the blocks a running sequence will still take from the pool, over all groups, beyond those it holds
  // now, before it holds `final_len` tokens, computing at most max_chunk tokens a step (1 once only decoding is
  // left): a full group's table grows to final_len, a sliding group holds a chunk and the window before it at most
  // and gives back what falls out of the window. A block it shares with another sequence is not counted as coming
  // back to the pool when it gives it back (the other may hold it longer), so reservations summed over sequences
  // never fall short.
  int64_t blocks_to_finish(const Sequence& seq, int64_t final_len, int64_t max_chunk) const;
  // The same for a waiting sequence about to take `match` (match_prefix) and grow its tables to table_blocks.
  int64_t blocks_to_finish(const PrefixMatch& match, int64_t table_blocks, int64_t final_len, int64_t max_chunk) const;
  PrefixMatch match_prefix(const Sequence& seq) const;
  // Gives `seq` (no blocks, nothing computed) the blocks of `match` (match_prefix(seq), nothing changed in
  // between) and marks their tokens computed.
  void take_prefix(Sequence& seq, const PrefixMatch& match);
  // Registers the blocks of `seq` that became full of computed tokens since the last call (a no-op without
  // prefix caching). Call after seq.num_computed_tokens advanced.
  void cache_full_blocks(Sequence& seq);

  // Throws naming the first broken invariant: every block is free (once), cached and unheld (once), or held;
  // a held block's reference count is the number of `holders` (the sequences that may hold blocks: waiting and
  // running ones) whose tables list it; a block listed twice is a registered block of that group full of computed
  // tokens equal to each holder's tokens there; registrations point at their blocks; every block is accounted for;
  // a holder has one table per group, all of one length; kReleasedBlock entries are a leading run of a sliding
  // group's table, each wholly before the window of the holder's next token.
  void check_invariants(const std::vector<const Sequence*>& holders) const;

  // A sequence's table of `group` (group 0: seq.block_table).
  static const std::vector<int32_t>& table(const Sequence& seq, int64_t group);

 private:
  struct Block {
    int32_t ref = 0;          // sequences holding it
    bool registered = false;  // in by_hash_ (prefix caching): its KV is that of `tokens` after the parent chain
    int32_t group = 0;        // the group whose table registered it
    uint64_t hash = 0, parent_hash = 0;  // hash: its key in by_hash_ (the chain hash and the group); parent: chain
    std::vector<int64_t> tokens;
    std::list<int32_t>::iterator lru;  // its place in evictable_ while registered with no holder
  };
  // The table of `group` to grow or edit; gives seq a table for every group first.
  std::vector<int32_t>& mutable_table(Sequence& seq, int64_t group);
  // The chain hash of block `index` of seq (its tokens after the chain hash `parent`), and the tokens themselves.
  uint64_t hash_block(const Sequence& seq, int64_t index, uint64_t parent, std::vector<int64_t>* tokens) const;
  // by_hash_'s key of a group's block with chain hash h.
  static uint64_t group_key(int64_t group, uint64_t h);
  // The registered block of `group` with this chain hash, parent hash and tokens of seq's block `index`, or -1.
  int32_t lookup(const Sequence& seq, int64_t index, int64_t group, uint64_t hash, uint64_t parent) const;
  // blocks_to_finish's bound for one group of a sequence holding `held` blocks of it, `shared` of them with others.
  int64_t drain_to_finish(int64_t group, int64_t held, int64_t shared, int64_t table_blocks, int64_t final_len,
                          int64_t max_chunk) const;
  // The first block of a table that the window of a token at `position` reaches (0 for a full group).
  int64_t first_visible_block(int64_t group, int64_t position) const;
  int32_t take_free_block();
  void unregister(int32_t b);
  void release_block(int32_t b);  // one holder fewer; the last one's release frees it, or makes it evictable

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<int64_t> windows_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;        // a stack of never-registered blocks: the most recently freed is reused first
  std::list<int32_t> evictable_;     // registered blocks no sequence holds, least recently released first
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace kbn::engine
