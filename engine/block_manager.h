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

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching = false);

  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks an allocation can take: never-registered free blocks plus cached blocks no sequence holds.
  int64_t num_free_blocks() const { return int64_t(free_.size() + evictable_.size()); }
  // Registered blocks (held or not), i.e. how many blocks of KV the prefix cache can serve.
  int64_t num_cached_blocks() const { return int64_t(by_hash_.size()); }
  // Blocks that hold num_tokens tokens.
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Blocks `seq` must still get so that its table covers its first num_tokens tokens.
  int64_t blocks_needed(const Sequence& seq, int64_t num_tokens) const;
  bool can_allocate(const Sequence& seq, int64_t num_tokens) const;
  // Grows seq.block_table to cover num_tokens tokens; throws when too few blocks are free (ask can_allocate).
  void allocate(Sequence& seq, int64_t num_tokens);
  // Releases every block of `seq` and clears its table (and its prefix-hash state).
  void free(Sequence& seq);

  // Sliding-window attention (vLLM's SlidingWindowManager): when every attention layer that reads these blocks
  // sees only the last `window` keys, the leading blocks of `seq` whose every slot lies before the window of the
  // next token it computes (position num_computed_tokens: it sees keys num_computed_tokens - window + 1 on) are
  // never read again; they go back to the pool (a cached block stays cached, and evictable once no sequence holds
  // it) and their table entries become kReleasedBlock. The attention kernels never read a page before a window,
  // so those entries are never dereferenced (the step's block tables may carry any id there). Call after
  // cache_full_blocks, so that released blocks were registered first. Returns how many blocks were released.
  static constexpr int32_t kReleasedBlock = -1;
  int64_t release_outside_window(Sequence& seq, int64_t window);

  // Prefix caching. The leading full blocks of a sequence that holds no blocks whose KV is cached: at most
  // (num_tokens - 1) / block_size of them, so that the last token is always computed (a step samples from it).
  struct PrefixMatch {
    std::vector<int32_t> blocks;  // the leading blocks found, in order
    int64_t evictable = 0;        // of those, held by no sequence (they count in num_free_blocks until taken)
    uint64_t hash = 0;            // the chain hash after the last of them
    int64_t num_blocks() const { return int64_t(blocks.size()); }
  };
  PrefixMatch match_prefix(const Sequence& seq) const;
  // Gives `seq` (no blocks, nothing computed) the blocks of `match` (match_prefix(seq), nothing changed in
  // between) and marks their tokens computed.
  void take_prefix(Sequence& seq, const PrefixMatch& match);
  // Registers the blocks of `seq` that became full of computed tokens since the last call (a no-op without
  // prefix caching). Call after seq.num_computed_tokens advanced.
  void cache_full_blocks(Sequence& seq);

  // Throws naming the first broken invariant: every block is free (once), cached and unheld (once), or held;
  // a held block's reference count is the number of `holders` (the sequences that may hold blocks: waiting and
  // running ones) whose table lists it; a block listed by two holders is a registered block full of computed
  // tokens equal to each holder's tokens there; registrations point at their blocks; every block is accounted for.
  // With `window` > 0, a holder's table may start with kReleasedBlock entries, each wholly before the window of its
  // next token (release_outside_window); with 0 none is allowed.
  void check_invariants(const std::vector<const Sequence*>& holders, int64_t window = 0) const;

 private:
  struct Block {
    int32_t ref = 0;          // sequences holding it
    bool registered = false;  // in by_hash_ (prefix caching): its KV is that of `tokens` after the parent chain
    uint64_t hash = 0, parent_hash = 0;
    std::vector<int64_t> tokens;
    std::list<int32_t>::iterator lru;  // its place in evictable_ while registered with no holder
  };
  // The hash of block `index` of seq (its tokens after the chain hash `parent`), and the tokens themselves.
  uint64_t hash_block(const Sequence& seq, int64_t index, uint64_t parent, std::vector<int64_t>* tokens) const;
  // The registered block with this hash, parent hash and tokens of seq's block `index`, or -1.
  int32_t lookup(const Sequence& seq, int64_t index, uint64_t hash, uint64_t parent) const;
  int32_t take_free_block();
  void unregister(int32_t b);
  void release_block(int32_t b);  // one holder fewer; the last one's release frees it, or makes it evictable

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;        // a stack of never-registered blocks: the most recently freed is reused first
  std::list<int32_t> evictable_;     // registered blocks no sequence holds, least recently released first
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace kbn::engine
