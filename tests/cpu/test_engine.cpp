// The continuous-batching engine: scheduler and block-manager invariants under random request mixes (a
// model-free driver whose fake KV cache checks that every sequence reads back exactly the tokens it wrote),
// and the real tiny Llama on CPU: Hugging Face's greedy tokens, batching / chunked prefill / preemption not
// changing them, seeded sampling, stop rules; plus workloads and metrics.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/workloads.h"
#include "engine_requests.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

// ---- a model-free driver ----

// The fake model's next token: a hash of every token of the sequence, so it depends on the whole history
// (a lost or duplicated token changes everything after it).
int64_t fake_next_token(const std::vector<int64_t>& tokens, int64_t vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t t : tokens) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return int64_t((h >> 17) % uint64_t(vocab));
}

std::vector<int64_t> all_tokens(const Sequence& s) {
  std::vector<int64_t> t = s.prompt;
  t.insert(t.end(), s.output.begin(), s.output.end());
  return t;
}

// What a request must produce, generated one token at a time with no scheduler at all.
std::vector<int64_t> expected_fake_output(const Request& r, int64_t vocab, int64_t max_model_len) {
  std::vector<int64_t> tokens = r.prompt, out;
  while (true) {
    const int64_t t = fake_next_token(tokens, vocab);
    out.push_back(t);
    tokens.push_back(t);
    const auto& eos = r.sampling.eos_token_ids;
    if (!r.sampling.ignore_eos && std::find(eos.begin(), eos.end(), t) != eos.end()) break;
    if (int64_t(out.size()) >= r.sampling.max_tokens || int64_t(tokens.size()) >= max_model_len) break;
  }
  return out;
}

struct DriveStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;  // tokens admissions found in the prefix cache
  int64_t chunked_steps = 0;  // steps where some prefill chunk did not reach its sequence's end
  int64_t mixed_steps = 0;    // steps with prefills and decodes together
};

// The identity of token t of `tokens` with everything before it: the KV of a slot is a function of exactly this.
uint64_t prefix_signature(const std::vector<int64_t>& tokens, int64_t t) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i <= t; ++i) h = (h ^ uint64_t(tokens[size_t(i)])) * 1099511628211ull;
  return h;
}

// Runs `requests` to completion through Scheduler + BlockManager, checking every step's contract and the
// invariants; the fake KV cache stores (KV cache group, position, token, signature of the whole prefix) per slot and
// every scheduled sequence reads its history back through each group's table (a sliding group: the keys its window
// shows the step's tokens), so a block shared by prefix caching must hold exactly the reader's own prefix, and a
// block one group gave back and another took must not be read as the first's. Returns the outputs by request id.
// async: as LLMEngine's async scheduling, each step is scheduled and "launched" (the fake forward runs on the tokens
// the device has, sampled ids included) before the previous step's ids reach the scheduler (Scheduler::complete).
std::map<int64_t, std::vector<int64_t>> drive(const SchedulerConfig& cfg, int64_t num_blocks, int64_t block_size,
                                              const std::vector<Request>& requests, int64_t vocab,
                                              DriveStats* stats = nullptr, bool prefix_caching = false,
                                              const std::vector<int64_t>& windows = {0}, bool async = false) {
  struct Slot {
    int64_t group = -1, pos = -1, token = -1;
    uint64_t prefix = 0;
  };
  BlockManager blocks(num_blocks, block_size, prefix_caching, windows);
  Scheduler sched(cfg, blocks);
  // Each request's tokens as the device has them: the prompt, then every id sampled (a discarded one too).
  std::map<int64_t, std::vector<int64_t>> device;
  for (const Request& r : requests) {
    sched.add(std::make_unique<Sequence>(r, 0.0));
    device[r.id] = r.prompt;
  }
  std::vector<Slot> kv(size_t(num_blocks * block_size));
  std::optional<SchedulerOutput> in_flight;  // async: launched, its ids not given to the scheduler yet
  std::vector<int64_t> in_flight_ids;
  std::vector<std::unique_ptr<Sequence>> retired;  // finished while a launched step names them
  std::map<int64_t, std::vector<int64_t>> outputs;
  DriveStats st;
  auto slot = [&](const Sequence& s, int64_t g, int64_t t) {
    const int32_t b = BlockManager::table(s, g)[size_t(t / block_size)];
    KBN_CHECK(b >= 0, "drive: sequence ", s.id, " uses token ", t, " of group ", g, " in a block it gave back");
    return int64_t(b) * block_size + t % block_size;
  };
  const auto finish = [&](const SchedulerOutput& o, const std::vector<int64_t>& ids) {
    std::vector<std::unique_ptr<Sequence>> done = sched.complete(o, ids, double(st.steps));
    for (auto& d : done) {
      KBN_CHECK(d->status == SequenceStatus::finished && d->block_table.empty(), "drive: sequence ", d->id,
                " finished without releasing its blocks");
      KBN_CHECK(d->num_pending <= 1, "drive: sequence ", d->id, " finished with ", d->num_pending, " pending tokens");
      outputs[d->id] = d->output;
    }
    retired = std::move(done);
    sched.check_invariants();
  };
  while (sched.has_unfinished()) {
    KBN_CHECK(st.steps < 100000, "drive: no completion after ", st.steps, " steps");
    std::vector<int64_t> running_decodes;
    for (const Sequence* s : sched.running())
      if (s->num_uncomputed_tokens() == 1 && !sched.ends_with_pending(*s)) running_decodes.push_back(s->id);
    const SchedulerOutput out = sched.schedule();
    sched.check_invariants();

    // The step's contract. Async: a step may be empty while every request waits for an id in flight.
    KBN_CHECK(!out.empty() || in_flight, "drive: empty step with unfinished requests");
    KBN_CHECK(out.num_tokens <= cfg.max_num_batched_tokens, "drive: ", out.num_tokens, " tokens > budget ",
              cfg.max_num_batched_tokens);
    KBN_CHECK(int64_t(out.seqs.size()) <= cfg.max_num_seqs, "drive: ", out.seqs.size(), " sequences > max_num_seqs");
    int64_t sum = 0;
    bool any_prefill_work = false;
    std::set<int64_t> ids;
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSequence& e = out.seqs[i];
      KBN_CHECK(ids.insert(e.seq->id).second, "drive: sequence ", e.seq->id, " scheduled twice");
      KBN_CHECK(e.num_new_tokens >= 1, "drive: empty chunk");
      KBN_CHECK((int64_t(i) < out.num_prefills) == (e.num_new_tokens > 1), "drive: entry ", i,
                " breaks prefills-then-decodes order (num_prefills ", out.num_prefills, ")");
      KBN_CHECK(e.num_computed_tokens == e.seq->num_computed_tokens, "drive: stale num_computed_tokens");
      KBN_CHECK(e.samples == (e.num_computed_tokens + e.num_new_tokens == e.seq->num_tokens()),
                "drive: samples flag wrong for sequence ", e.seq->id);
      KBN_CHECK(int64_t(e.seq->block_table.size()) * block_size >= e.num_computed_tokens + e.num_new_tokens,
                "drive: sequence ", e.seq->id, " lacks blocks");
      sum += e.num_new_tokens;
      if (std::find(running_decodes.begin(), running_decodes.end(), e.seq->id) == running_decodes.end())
        any_prefill_work = true;
    }
    KBN_CHECK(sum == out.num_tokens, "drive: num_tokens ", out.num_tokens, " != sum of chunks ", sum);
    // Decodes come first in the budget: if anything else got tokens, every running decode was served or
    // preempted.
    if (any_prefill_work)
      for (int64_t id : running_decodes)
        KBN_CHECK(ids.count(id) || std::count(out.preempted_ids.begin(), out.preempted_ids.end(), id),
                  "drive: decode of sequence ", id, " skipped while prefill work was scheduled");
    if (std::any_of(out.seqs.begin(), out.seqs.end(), [](const auto& e) { return !e.samples; })) st.chunked_steps++;
    if (out.num_prefills > 0 && out.num_decodes() > 0) st.mixed_steps++;

    // The fake forward, on the device's tokens: every group writes this step's tokens, then every sequence reads back
    // what its tokens see.
    const int64_t groups = int64_t(windows.size());
    for (const ScheduledSequence& e : out.seqs) {
      const std::vector<int64_t>& d = device.at(e.seq->id);
      KBN_CHECK(int64_t(d.size()) >= e.num_computed_tokens + e.num_new_tokens, "drive: sequence ", e.seq->id,
                " computes token ", e.num_computed_tokens + e.num_new_tokens - 1, " the device has not sampled");
      for (int64_t t = 0; t < e.seq->num_known_tokens(); ++t)
        KBN_CHECK(d[size_t(t)] == e.seq->token(t), "drive: sequence ", e.seq->id, " token ", t, " differs on the host");
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t t = e.num_computed_tokens; t < e.num_computed_tokens + e.num_new_tokens; ++t)
          kv[size_t(slot(*e.seq, g, t))] = {g, t, d[size_t(t)], prefix_signature(d, t)};
    }
    std::vector<int64_t> sampled;
    for (const ScheduledSequence& e : out.seqs) {
      std::vector<int64_t>& d = device.at(e.seq->id);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t w = windows[size_t(g)];
        const int64_t first = w > 0 ? std::max<int64_t>(0, e.num_computed_tokens - w + 1) : 0;
        for (int64_t t = first; t < e.num_computed_tokens + e.num_new_tokens; ++t) {
          const Slot& s = kv[size_t(slot(*e.seq, g, t))];
          KBN_CHECK(s.group == g && s.pos == t && s.token == d[size_t(t)] && s.prefix == prefix_signature(d, t),
                    "drive: sequence ", e.seq->id, " position ", t, " of group ", g, " reads back (group ", s.group,
                    ", pos ", s.pos, ", token ", s.token, ") or another prefix's KV");
        }
      }
      if (!e.samples) continue;
      KBN_CHECK(int64_t(d.size()) == e.num_computed_tokens + e.num_new_tokens, "drive: sequence ", e.seq->id,
                " samples token ", e.num_computed_tokens + e.num_new_tokens, " with ", d.size(), " on the device");
      sampled.push_back(fake_next_token(d, vocab));
      d.push_back(sampled.back());
    }
    if (!out.empty()) sched.commit(out);
    if (in_flight) finish(*in_flight, in_flight_ids);
    in_flight.reset();
    if (!out.empty()) {
      if (async) {
        in_flight = out;
        in_flight_ids = sampled;
      } else {
        finish(out, sampled);
      }
    }
    if (!sched.has_unfinished() && in_flight) {  // only ids to discard left
      finish(*in_flight, in_flight_ids);
      in_flight.reset();
    }
    st.steps++;
  }
  KBN_CHECK(!in_flight, "drive: a launched step left");
  KBN_CHECK(blocks.num_free_blocks() == num_blocks, "drive: ", num_blocks - blocks.num_free_blocks(),
            " blocks leaked after every request finished");
  st.preemptions = sched.num_preemptions();
  st.cached_tokens = sched.num_cached_tokens();
  KBN_CHECK(prefix_caching || st.cached_tokens == 0, "drive: cache hits with prefix caching off");
  if (stats) *stats = st;
  return outputs;
}

// ---- the tiny Llama fixture ----

ModelSpec tiny_spec() { return resolve_model(kbn::test::fixture_dir() + "/tiny-llama"); }

std::unique_ptr<CausalLM> tiny_model() {
  return build_model(tiny_spec(), Variant::baseline, {DType::f32, Device::cpu()}, 0);
}

EngineConfig small_config() {
  EngineConfig c;
  c.max_model_len = 2048;
  c.num_kv_blocks = 256;
  c.block_size = 4;  // sequences span several blocks
  return c;
}

using kbn::test::greedy_request;

std::vector<std::vector<int64_t>> run_tokens(CausalLM& model, const EngineConfig& cfg, const std::vector<Request>& reqs,
                                             RunResult* result = nullptr) {
  LLMEngine engine(model, Variant::baseline, Device::cpu(), cfg);
  RunResult r = engine.run_to_completion(reqs);
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& o : r.outputs) tokens.push_back(o.tokens);
  if (result) *result = std::move(r);
  return tokens;
}

// Prompts of mixed lengths (1 to 23 tokens) with ids from a fixed pattern.
std::vector<Request> mixed_requests(int64_t max_tokens) {
  std::vector<Request> reqs;
  const std::vector<int64_t> lens = {7, 1, 23, 12, 5, 16};
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<int64_t> p;
    for (int64_t j = 0; j < lens[i]; ++j) p.push_back((int64_t(i) * 97 + j * 31 + 5) % 512);
    reqs.push_back(greedy_request(int64_t(i), p, max_tokens));
  }
  return reqs;
}

}  // namespace

// ---- block manager and scheduler, no model ----

TEST(EngineBlockManager, AllocatesAsSequencesGrowAndFreesEverything) {
  BlockManager bm(5, 4);
  Sequence a, b;
  a.id = 1;
  b.id = 2;
  EXPECT_EQ(bm.blocks_needed(a, 9), 3);
  bm.allocate(a, 9);
  EXPECT_EQ(a.block_table.size(), 3u);
  bm.allocate(a, 12);  // still fits in 3 blocks
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_TRUE(bm.can_allocate(b, 8));
  EXPECT_FALSE(bm.can_allocate(b, 9));
  bm.allocate(b, 8);
  bm.check_invariants({&a, &b});
  EXPECT_THROW(bm.allocate(a, 13), Error);
  bm.free(a);
  EXPECT_EQ(bm.num_free_blocks(), 3);
  bm.check_invariants({&a, &b});
  bm.free(b);
  EXPECT_EQ(bm.num_free_blocks(), 5);
}

TEST(EngineBlockManager, InvariantCheckCatchesSharedAndLeakedBlocks) {
  BlockManager bm(4, 2);
  Sequence a, b;
  a.id = 1;
  b.id = 2;
  bm.allocate(a, 3);
  b.block_table = {a.block_table[0]};  // forged: a block owned twice
  EXPECT_THROW(bm.check_invariants({&a, &b}), Error);
  b.block_table.clear();
  EXPECT_THROW(bm.check_invariants({&b}), Error);  // a's blocks are held by no listed sequence: leaked
  bm.check_invariants({&a, &b});
}

// A sequence whose first `computed` tokens are computed, with `tokens` as its prompt.
Sequence computed_sequence(BlockManager& bm, int64_t id, std::vector<int64_t> tokens, int64_t computed) {
  Sequence s;
  s.id = id;
  s.prompt = std::move(tokens);
  bm.allocate(s, computed);
  s.num_computed_tokens = computed;
  bm.cache_full_blocks(s);
  return s;
}

TEST(EngineBlockManager, PrefixCachingSharesFullBlocksOfTheSamePrefix) {
  BlockManager bm(8, 4, /*prefix_caching=*/true);
  Sequence a = computed_sequence(bm, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 13);
  EXPECT_EQ(bm.num_cached_blocks(), 3);  // the 4th block holds one token: not full, not cached
  // b shares a's first 9 tokens: blocks 0 and 1 are whole; block 2 differs at its second token.
  Sequence b;
  b.id = 2;
  b.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 11, 12, 13, 14};
  BlockManager::PrefixMatch m = bm.match_prefix(b);
  EXPECT_EQ(m.num_blocks(), 2);
  EXPECT_EQ(m.evictable, 0);  // a holds them
  bm.take_prefix(b, m);
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(b.block_table, std::vector<int32_t>(a.block_table.begin(), a.block_table.begin() + 2));
  bm.allocate(b, 14);
  b.num_computed_tokens = 14;
  bm.cache_full_blocks(b);
  bm.check_invariants({&a, &b});
  EXPECT_EQ(bm.num_free_blocks(), 8 - 4 - 2);
  // a leaves: its blocks 2 (cached, now evictable) and 3 (half full, free) are released; 0 and 1 stay with b.
  bm.free(a);
  bm.check_invariants({&b});
  EXPECT_EQ(bm.num_free_blocks(), 4);
  bm.free(b);
  bm.check_invariants({});
  EXPECT_EQ(bm.num_free_blocks(), 8);
  // A copy of a finds its three cached blocks with no holder, and computes its last token anyway.
  Sequence c;
  c.id = 3;
  c.prompt = a.prompt;
  m = bm.match_prefix(c);
  EXPECT_EQ(m.num_blocks(), 3);
  EXPECT_EQ(m.evictable, 3);
  // 12 tokens exactly: only (12 - 1) / 4 = 2 blocks, so that the step has a token to sample from.
  c.prompt.resize(12);
  EXPECT_EQ(bm.match_prefix(c).num_blocks(), 2);
}

TEST(EngineBlockManager, PrefixCachingEvictsTheLeastRecentlyReleasedTailFirst) {
  BlockManager bm(4, 2, /*prefix_caching=*/true);
  Sequence a = computed_sequence(bm, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 8);  // 4 full blocks, all cached
  bm.free(a);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_EQ(bm.num_cached_blocks(), 4);
  // A stranger needs one block: a's last block goes, so a copy of a still finds its first three.
  Sequence x = computed_sequence(bm, 2, {42, 43}, 2);
  EXPECT_EQ(bm.num_cached_blocks(), 4);  // x's own full block was registered in its place
  Sequence a2;
  a2.id = 3;
  a2.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(bm.match_prefix(a2).num_blocks(), 3);
  bm.free(x);
  bm.check_invariants({});
  // Without prefix caching nothing is remembered.
  BlockManager plain(4, 2);
  Sequence p = computed_sequence(plain, 1, {1, 2, 3, 4, 5}, 4);
  plain.free(p);
  EXPECT_EQ(plain.num_cached_blocks(), 0);
  EXPECT_EQ(plain.match_prefix(a2).num_blocks(), 0);
}

TEST(EngineBlockManager, InvariantCheckCatchesWrongSharing) {
  BlockManager bm(6, 2, /*prefix_caching=*/true);
  Sequence a = computed_sequence(bm, 1, {1, 2, 3}, 3);  // block 0 cached, block 1 half full
  Sequence b;
  b.id = 2;
  b.prompt = {7, 7, 7};
  b.block_table = {a.block_table[1]};  // forged share of a block that is not cached
  EXPECT_THROW(bm.check_invariants({&a, &b}), Error);
  b.block_table = {a.block_table[0]};  // forged share of a cached block that holds other tokens
  b.num_computed_tokens = 2;
  EXPECT_THROW(bm.check_invariants({&a, &b}), Error);
  b.block_table.clear();
  b.num_computed_tokens = 0;
  bm.check_invariants({&a, &b});
}

TEST(EngineScheduler, PrefixCachingGivesTheSameTokensWithFewerComputed) {
  // Eight requests with one 12-token system prompt, admitted a few at a time (the budget), on a pool small
  // enough to preempt: the same outputs as with prefix caching off, and cache hits.
  SchedulerConfig cfg{24, 8, 64};
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 8; ++i) {
    std::vector<int64_t> prompt = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2, 9};
    for (int64_t j = 0; j <= i; ++j) prompt.push_back(10 + i + j);
    reqs.push_back(greedy_request(i, prompt, 12));
  }
  DriveStats off, on;
  const auto a = drive(cfg, 24, 4, reqs, 50, &off, false);
  const auto b = drive(cfg, 24, 4, reqs, 50, &on, true);
  EXPECT_EQ(a, b);
  EXPECT_EQ(off.cached_tokens, 0);
  EXPECT_GT(on.cached_tokens, 0);
  for (const Request& r : reqs) EXPECT_EQ(b.at(r.id), expected_fake_output(r, 50, cfg.max_model_len));
}

TEST(EngineScheduler, PrefixCachingNeverSharesAPartlyComputedBlock) {
  // Two 13-token prompts that agree on their first 12 tokens, a 10-token budget: the first prompt's step 1 leaves
  // its third block half computed; the second prompt, admitted in step 2, must take only the two full blocks.
  SchedulerConfig cfg{10, 4, 64};
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 2; ++i) reqs.push_back(greedy_request(i, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9 + i}, 3));
  BlockManager bm(16, 4, /*prefix_caching=*/true);
  Scheduler s(cfg, bm);
  for (const Request& r : reqs) s.add(std::make_unique<Sequence>(r, 0.0));
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].num_new_tokens, 10);
  s.update(out, {}, 0.0);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  out = s.schedule();
  s.check_invariants();
  ASSERT_EQ(out.seqs.size(), 2u);
  EXPECT_EQ(out.seqs[1].seq->id, 1);
  EXPECT_EQ(out.seqs[1].num_computed_tokens, 8);  // two cached blocks, not the half-computed third
  EXPECT_EQ(s.num_cached_tokens(), 8);
  DriveStats st;
  const auto outputs = drive(cfg, 16, 4, reqs, 50, &st, true);
  EXPECT_EQ(st.cached_tokens, 8);
  for (const Request& r : reqs) EXPECT_EQ(outputs.at(r.id), expected_fake_output(r, 50, cfg.max_model_len));
}

// Sliding windows: a sequence keeps only the blocks its next token's window reaches; the rest return to the pool
// (a cached one stays cached, evictable), and a shared block stays held by its other holder.
TEST(EngineBlockManager, SlidingWindowReleasesBlocksBeforeTheWindow) {
  BlockManager bm(16, 4, /*prefix_caching=*/true, {6});
  std::vector<int64_t> prompt(20);
  for (int64_t i = 0; i < 20; ++i) prompt[size_t(i)] = 100 + i;
  Sequence a = computed_sequence(bm, 1, prompt, 20);  // 5 full blocks, registered
  EXPECT_EQ(bm.release_outside_windows(a), 3);        // the next token (20) sees 15..20: blocks 0-2 end before 15
  EXPECT_EQ(a.block_table[0], BlockManager::kReleasedBlock);
  EXPECT_EQ(a.block_table[2], BlockManager::kReleasedBlock);
  EXPECT_NE(a.block_table[3], BlockManager::kReleasedBlock);
  bm.check_invariants({&a});
  EXPECT_EQ(bm.release_outside_windows(a), 0);  // idempotent
  EXPECT_EQ(bm.num_free_blocks(), 16 - 2);      // the 3 released are evictable (cached), so free to take
  // A second sequence with the same prompt takes the cached blocks its window needs (its first token to compute,
  // 16, sees 11..16: blocks 2 and 3; blocks 0-1 are not taken); a's release does not disturb it.
  Sequence b;
  b.id = 2;
  b.prompt = prompt;
  const BlockManager::PrefixMatch m = bm.match_prefix(b);
  EXPECT_EQ(m.num_blocks(), 4);
  bm.take_prefix(b, m);
  EXPECT_EQ(b.num_computed_tokens, 16);
  EXPECT_EQ(b.block_table[1], BlockManager::kReleasedBlock);
  EXPECT_EQ(b.block_table[3], a.block_table[3]);
  bm.check_invariants({&a, &b});
  // A forged release inside the window is caught.
  Sequence c = computed_sequence(bm, 3, {1, 2, 3, 4, 5, 6, 7, 8}, 8);
  const int32_t kept = c.block_table[1];
  c.block_table[1] = BlockManager::kReleasedBlock;
  EXPECT_THROW(bm.check_invariants({&a, &b, &c}), Error);
  c.block_table[1] = kept;
  bm.free(a);
  bm.free(b);
  bm.free(c);
  bm.check_invariants({});
  EXPECT_EQ(bm.num_free_blocks(), 16);
  // Without a sliding group nothing is released, and a released entry is an error.
  BlockManager full(8, 4);
  Sequence d = computed_sequence(full, 4, prompt, 20);
  EXPECT_EQ(full.release_outside_windows(d), 0);
  d.block_table[0] = BlockManager::kReleasedBlock;
  EXPECT_THROW(full.check_invariants({&d}), Error);
  EXPECT_THROW(BlockManager(8, 4, false, {}), Error);
  EXPECT_THROW(BlockManager(8, 4, false, {0, -1}), Error);
}

// Two KV cache groups (gpt-oss: full layers and 128-key sliding ones): one table per group over one pool, each
// block in one table; the full group keeps every block, the sliding group its window's; a prefix-cache hit takes
// the full group's blocks and the sliding group's within the window, never a block registered by the other group.
TEST(EngineBlockManager, GroupsKeepATableEachOverOnePool) {
  BlockManager bm(32, 4, /*prefix_caching=*/true, {0, 6});
  EXPECT_EQ(bm.num_groups(), 2);
  std::vector<int64_t> prompt(20);
  for (int64_t i = 0; i < 20; ++i) prompt[size_t(i)] = 7 * i + 1;
  Sequence a = computed_sequence(bm, 1, prompt, 20);
  ASSERT_EQ(a.more_block_tables.size(), 1u);
  EXPECT_EQ(a.block_table.size(), 5u);
  EXPECT_EQ(a.more_block_tables[0].size(), 5u);
  EXPECT_EQ(bm.num_free_blocks(), 32 - 10);
  std::set<int32_t> distinct(a.block_table.begin(), a.block_table.end());
  distinct.insert(a.more_block_tables[0].begin(), a.more_block_tables[0].end());
  EXPECT_EQ(distinct.size(), 10u);
  const std::vector<int32_t> sliding = a.more_block_tables[0];
  EXPECT_EQ(bm.release_outside_windows(a), 3);  // group 1 only
  EXPECT_GE(a.block_table[0], 0);
  EXPECT_EQ(a.more_block_tables[0][2], BlockManager::kReleasedBlock);
  bm.check_invariants({&a});
  Sequence b;
  b.id = 2;
  b.prompt = prompt;
  const BlockManager::PrefixMatch m = bm.match_prefix(b);
  ASSERT_EQ(m.num_blocks(), 4);
  bm.take_prefix(b, m);
  EXPECT_EQ(b.block_table, std::vector<int32_t>(a.block_table.begin(), a.block_table.begin() + 4));
  EXPECT_EQ(b.more_block_tables[0][1], BlockManager::kReleasedBlock);
  EXPECT_EQ(b.more_block_tables[0][2], sliding[2]);  // released by a, but cached: taken back
  EXPECT_EQ(b.more_block_tables[0][3], a.more_block_tables[0][3]);
  bm.check_invariants({&a, &b});
  // Blocks needed count every group: b's tables grow by one block each.
  EXPECT_EQ(bm.blocks_needed(b, 20), 2);
  bm.allocate(b, 20);
  bm.check_invariants({&a, &b});
  // The bound the scheduler admits by: a full table of max_len, a sliding one of a chunk and the window before it.
  EXPECT_EQ(bm.max_blocks_held(400, 16), 100 + std::min<int64_t>(100, (16 + 5 + 3) / 4 + 1));
  bm.free(a);
  bm.free(b);
  bm.check_invariants({});
  EXPECT_EQ(bm.num_free_blocks(), 32);
}

// Property: sequences growing chunk by chunk over random KV cache groups keep at most each sliding window's blocks
// (plus the partial ones at both ends), never share a block between groups, take cached prefixes when they can, and
// the invariants hold after every operation, with and without prefix caching.
RC_GTEST_PROP(EngineBlockManager, SlidingGroupsKeepAWindowOfBlocks, ()) {
  const int64_t block_size = *rc::gen::inRange<int64_t>(1, 9);
  const auto windows = *rc::gen::container<std::vector<int64_t>>(
      size_t(*rc::gen::inRange<int64_t>(1, 4)),
      rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::inRange<int64_t>(1, 40)));
  const bool prefix_caching = *rc::gen::arbitrary<bool>();
  const int64_t n = *rc::gen::inRange<int64_t>(1, 6);
  const int64_t pool = int64_t(windows.size()) * n * 120;  // every sequence's whole length in every group
  BlockManager bm(pool, block_size, prefix_caching, windows);
  std::vector<Sequence> seqs(static_cast<size_t>(n));
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < n; ++i) {
    seqs[size_t(i)].id = i;
    const int64_t len = *rc::gen::inRange<int64_t>(1, 120);
    lengths.push_back(len);
    // Two prompt families, so prefix caching shares blocks between sequences.
    for (int64_t t = 0; t < len; ++t) seqs[size_t(i)].prompt.push_back((i % 2) * 1000 + t);
  }
  auto holders = [&] {
    std::vector<const Sequence*> h;
    for (const auto& s : seqs) h.push_back(&s);
    return h;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t i = 0; i < n; ++i) {
      Sequence& s = seqs[size_t(i)];
      if (s.num_computed_tokens >= lengths[size_t(i)]) continue;
      if (s.num_computed_tokens == 0 && s.block_table.empty()) bm.take_prefix(s, bm.match_prefix(s));
      const int64_t chunk = *rc::gen::inRange<int64_t>(1, 17);
      const int64_t upto = std::min(lengths[size_t(i)], s.num_computed_tokens + chunk);
      bm.allocate(s, upto);
      s.num_computed_tokens = upto;
      bm.cache_full_blocks(s);
      bm.release_outside_windows(s);
      bm.check_invariants(holders());
      for (int64_t g = 0; g < bm.num_groups(); ++g) {
        int64_t held = 0;
        const Sequence& cs = s;
        for (int32_t b : BlockManager::table(cs, g)) held += b != BlockManager::kReleasedBlock;
        // Keys [upto - window + 1, upto) and the slot of token upto's block: at most window / block_size + 2.
        const int64_t w = windows[size_t(g)];
        const bool bounded = w == 0 ? held == bm.blocks_for(upto) : held <= w / block_size + 2;
        RC_ASSERT(bounded);
      }
      progress = true;
    }
  }
  for (auto& s : seqs) bm.free(s);
  bm.check_invariants({});
  RC_ASSERT(bm.num_free_blocks() == pool);
}

RC_GTEST_PROP(EngineScheduler, RandomMixesKeepInvariantsAndFinishEveryRequest, ()) {
  SchedulerConfig cfg;
  const int64_t block_size = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t vocab = *rc::gen::inRange<int64_t>(2, 40);
  cfg.max_model_len = *rc::gen::inRange<int64_t>(2, 80);
  cfg.max_num_batched_tokens = *rc::gen::inRange<int64_t>(1, 100);
  cfg.max_num_seqs = *rc::gen::inRange<int64_t>(1, 10);
  const int64_t n = *rc::gen::inRange<int64_t>(1, 16);
  const bool prefix_caching = *rc::gen::arbitrary<bool>();
  cfg.reserve_max_tokens = *rc::gen::arbitrary<bool>();
  // KV cache groups: one full group (most models), or sliding and full groups mixed (gpt-oss, Gemma-3).
  const auto windows =
      *rc::gen::oneOf(rc::gen::just(std::vector<int64_t>{0}),
                      rc::gen::container<std::vector<int64_t>>(
                          size_t(*rc::gen::inRange<int64_t>(1, 4)),
                          rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::inRange<int64_t>(1, 30))));
  // Half the prompts start with one of two shared stems (a system prompt), so that prefix caching has hits.
  const auto stems = *rc::gen::container<std::vector<std::vector<int64_t>>>(
      2, rc::gen::container<std::vector<int64_t>>(size_t(cfg.max_model_len), rc::gen::inRange<int64_t>(0, vocab)));
  std::vector<Request> reqs;
  int64_t largest = 1;  // blocks of the longest request
  for (int64_t i = 0; i < n; ++i) {
    Request r;
    r.id = i * 3 - 7;  // any int64 is an id, negative ones too
    const int64_t len = *rc::gen::inRange<int64_t>(1, cfg.max_model_len);
    r.prompt = *rc::gen::container<std::vector<int64_t>>(size_t(len), rc::gen::inRange<int64_t>(0, vocab));
    const int64_t stem = *rc::gen::inRange<int64_t>(0, 4);
    if (stem < 2) {
      const int64_t shared = *rc::gen::inRange<int64_t>(0, len + 1);
      std::copy(stems[size_t(stem)].begin(), stems[size_t(stem)].begin() + shared, r.prompt.begin());
    }
    r.sampling.max_tokens = *rc::gen::inRange<int64_t>(1, 40);
    r.sampling.ignore_eos = *rc::gen::arbitrary<bool>();
    r.sampling.eos_token_ids = {0};
    largest =
        std::max(largest, max_blocks_held(windows, block_size, std::min(len + r.sampling.max_tokens, cfg.max_model_len),
                                          cfg.max_num_batched_tokens));
    reqs.push_back(std::move(r));
  }
  // From "one sequence at a time" (constant preemption) to plenty.
  const int64_t num_blocks = largest + *rc::gen::inRange<int64_t>(0, 3 * largest);
  RC_LOG() << "block_size " << block_size << " num_blocks " << num_blocks << " budget " << cfg.max_num_batched_tokens
           << " max_num_seqs " << cfg.max_num_seqs << " max_model_len " << cfg.max_model_len << " groups "
           << windows.size() << "\n";
  const bool async = *rc::gen::arbitrary<bool>();
  DriveStats st;
  auto outputs = drive(cfg, num_blocks, block_size, reqs, vocab, &st, prefix_caching, windows, async);
  RC_ASSERT(outputs.size() == reqs.size());
  RC_TAG(async ? "async scheduling" : "synchronous");
  for (const Request& r : reqs) RC_ASSERT(outputs.at(r.id) == expected_fake_output(r, vocab, cfg.max_model_len));
  RC_TAG(st.preemptions > 0 ? "preempted" : "no preemption");
  RC_TAG(st.chunked_steps > 0 ? "chunked" : "unchunked");
  RC_TAG(st.cached_tokens > 0 ? "prefix-cache hits" : "no prefix-cache hits");
  // Reserving every running request's growth leaves nothing to preempt.
  RC_ASSERT(!cfg.reserve_max_tokens || st.preemptions == 0);
}

TEST(EngineScheduler, SmallPoolPreemptsAndStillProducesEveryToken) {
  SchedulerConfig cfg{64, 8, 256};
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 6; ++i) {
    Request r;
    r.id = i;
    r.prompt.assign(size_t(10 + i), i + 1);
    r.sampling.max_tokens = 30;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  DriveStats st;
  auto outputs = drive(cfg, /*num_blocks=*/14, /*block_size=*/4, reqs, 50, &st);
  EXPECT_GT(st.preemptions, 0);
  for (const Request& r : reqs) EXPECT_EQ(outputs.at(r.id), expected_fake_output(r, 50, cfg.max_model_len));
  // Async scheduling: preempted sequences may have an id in flight; the same tokens.
  DriveStats async;
  EXPECT_EQ(drive(cfg, 14, 4, reqs, 50, &async, false, {0}, true), outputs);
  EXPECT_GT(async.preemptions, 0);
  // Admission that reserves every running request's max_tokens: no preemption, more steps, the same tokens.
  cfg.reserve_max_tokens = true;
  DriveStats reserved;
  EXPECT_EQ(drive(cfg, 14, 4, reqs, 50, &reserved), outputs);
  EXPECT_EQ(reserved.preemptions, 0);
}

TEST(EngineScheduler, ChunksPrefillsToTheBudgetAndMixesThemWithDecodes) {
  SchedulerConfig cfg{8, 4, 256};
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 3; ++i) {
    Request r;
    r.id = i;
    r.prompt.assign(size_t(20), 3);
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  DriveStats st;
  drive(cfg, 64, 4, reqs, 50, &st);
  EXPECT_GT(st.chunked_steps, 0);
  EXPECT_GT(st.mixed_steps, 0);

  // The first step: 8 tokens of the first prompt only, which samples nothing.
  BlockManager bm(64, 4);
  Scheduler s(cfg, bm);
  for (const Request& r : reqs) s.add(std::make_unique<Sequence>(r, 0.0));
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].num_new_tokens, 8);
  EXPECT_FALSE(out.seqs[0].samples);
  EXPECT_TRUE(s.update(out, {}, 0.0).empty());
}

TEST(EngineScheduler, RejectsRequestsThatCannotFit) {
  BlockManager bm(4, 4);
  Scheduler s(SchedulerConfig{64, 8, 32}, bm);
  Request r;
  r.id = 1;
  r.prompt.assign(20, 1);
  r.sampling.max_tokens = 8;  // 28 tokens need 7 blocks; the cache has 4
  try {
    s.add(std::make_unique<Sequence>(r, 0.0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV blocks"), std::string::npos) << e.what();
  }
  r.prompt.assign(32, 1);  // no room for a new token within max_model_len
  EXPECT_THROW(s.add(std::make_unique<Sequence>(r, 0.0)), Error);
  r.prompt.clear();
  EXPECT_THROW(s.add(std::make_unique<Sequence>(r, 0.0)), Error);
}

// ---- sampler ----

TEST(EngineSampler, FiltersAndDeterminism) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f, 3.0f, std::nanf("")};
  const int64_t v = int64_t(logits.size());
  SamplingParams greedy;
  EXPECT_EQ(sample_from_logits(logits.data(), v, greedy, 0), 1);  // lowest id among equal maxima; NaN never wins
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 1;
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(sample_from_logits(logits.data(), v, p, i), 1);
  p.top_k = 3;  // ids 1, 4, 2
  std::map<int64_t, int> seen;
  for (int64_t i = 0; i < 400; ++i) seen[sample_from_logits(logits.data(), v, p, i)]++;
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen.count(1) && seen.count(4) && seen.count(2));
  p.top_k = 0;
  p.top_p = 0.5;  // ids 1 and 4 hold ~36% each: the smallest set reaching 50% is both
  seen.clear();
  for (int64_t i = 0; i < 400; ++i) seen[sample_from_logits(logits.data(), v, p, i)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(4));
  // Unfiltered frequencies follow the softmax (loose: 4000 draws).
  p.top_p = 1.0;
  seen.clear();
  const int draws = 4000;
  for (int64_t i = 0; i < draws; ++i) seen[sample_from_logits(logits.data(), v, p, i)]++;
  double z = 0;
  for (int64_t i = 0; i < v - 1; ++i) z += std::exp(double(logits[size_t(i)]));
  for (int64_t i = 0; i < v - 1; ++i)
    EXPECT_NEAR(double(seen[i]) / draws, std::exp(double(logits[size_t(i)])) / z, 0.03) << "token " << i;
  EXPECT_EQ(seen.count(5), 0u);
  // Same (seed, index) -> same token; the seed changes the stream.
  int differ = 0;
  for (int64_t i = 0; i < 50; ++i) {
    SamplingParams q = p;
    EXPECT_EQ(sample_from_logits(logits.data(), v, q, i), sample_from_logits(logits.data(), v, q, i));
    q.seed = 12345;
    differ += sample_from_logits(logits.data(), v, q, i) != sample_from_logits(logits.data(), v, p, i);
  }
  EXPECT_GT(differ, 0);
}

// ---- workloads and metrics ----

// vLLM's random workload: lengths within [floor(len (1 - r)), floor(len (1 + r))], exact at r = 0, the count given.
TEST(EngineWorkloads, RandomWorkloadFromVllmFlags) {
  WorkloadOptions o;
  o.seed = 3;
  o.vocab_size = 500;
  o.max_model_len = 4096;
  const WorkloadSpec exact = random_workload_spec(256, 32, 10, 0.0);
  EXPECT_EQ(exact.name, "random");
  const Workload a = make_workload(exact, o);
  ASSERT_EQ(a.requests.size(), 10u);
  for (const Request& r : a.requests) {
    EXPECT_EQ(r.prompt.size(), 256u);
    EXPECT_EQ(r.sampling.max_tokens, 32);
  }
  const WorkloadSpec ranged = random_workload_spec(100, 40, 200, 0.5);
  EXPECT_EQ(ranged.input_min, 50);
  EXPECT_EQ(ranged.input_max, 150);
  EXPECT_EQ(ranged.output_min, 20);
  EXPECT_EQ(ranged.output_max, 60);
  const Workload b = make_workload(ranged, o);
  std::set<size_t> lens;
  for (const Request& r : b.requests) {
    EXPECT_GE(r.prompt.size(), 50u);
    EXPECT_LE(r.prompt.size(), 150u);
    lens.insert(r.prompt.size());
  }
  EXPECT_GT(lens.size(), 50u);  // spread over the range, not one length
  EXPECT_THROW(random_workload_spec(0, 5, 1, 0), Error);
  EXPECT_THROW(random_workload_spec(5, 5, 1, 1.0), Error);
}

// A JSONL dataset of token ids: per-line output lengths (output_len or max_tokens), the default otherwise, blank lines
// skipped, clipping as the named workloads, and each malformed line refused naming its number.
TEST(EngineWorkloads, DatasetOfTokenIdsOrText) {
  const std::string path = ::testing::TempDir() + "kbn_dataset.jsonl";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  WorkloadOptions o;
  o.vocab_size = 100;
  o.max_model_len = 12;
  write("{\"prompt_token_ids\": [1, 2, 3], \"output_len\": 4}\n\n{\"prompt_token_ids\": [5], \"max_tokens\": 2}\n"
        "{\"prompt_token_ids\": [9, 9, 9, 9, 9, 9, 9, 9, 9, 9]}\n");
  const Workload w = load_dataset_workload(path, 6, o);
  EXPECT_EQ(w.spec.name, "dataset");
  ASSERT_EQ(w.requests.size(), 3u);
  EXPECT_EQ(w.requests[0].prompt, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(w.requests[0].sampling.max_tokens, 4);
  EXPECT_EQ(w.requests[1].sampling.max_tokens, 2);
  EXPECT_EQ(w.requests[2].sampling.max_tokens, 6);  // the default
  EXPECT_EQ(w.requests[2].prompt.size(), 6u);        // 10 + 6 > 12: the prompt is shortened
  EXPECT_EQ(w.clipped, 1);
  o.num_requests = 2;
  EXPECT_EQ(load_dataset_workload(path, 6, o).requests.size(), 2u);
  o.num_requests = 0;
  auto error = [&](const std::string& text) {
    write(text);
    try {
      load_dataset_workload(path, 6, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("{\"prompt_token_ids\": [1]}\n{\"prompt\": \"hi\"}\n").find("line 2: a text 'prompt' needs the model's tokenizer"),
            std::string::npos);
  // With the model's tokenizer a text prompt becomes its ids (here a stand-in: one id per byte, mod the vocabulary).
  o.encode = [](const std::string& t) {
    std::vector<int64_t> ids;
    for (unsigned char ch : t) ids.push_back(ch % 100);
    return ids;
  };
  write("{\"prompt\": \"hi!\", \"output_len\": 3}\n");
  const Workload text = load_dataset_workload(path, 6, o);
  ASSERT_EQ(text.requests.size(), 1u);
  EXPECT_EQ(text.requests[0].prompt, (std::vector<int64_t>{'h' % 100, 'i' % 100, '!' % 100}));
  EXPECT_NE(error("{\"prompt\": 5}\n").find("'prompt' must be a non-empty string"), std::string::npos);
  EXPECT_NE(error("{\"prompt\": \"a\", \"prompt_token_ids\": [1]}\n").find("not both"), std::string::npos);
  o.encode = nullptr;
  EXPECT_NE(error("{\"prompt_token_ids\": [100]}\n").find("token id 100 is outside the vocabulary [0, 100)"),
            std::string::npos);
  EXPECT_NE(error("not json\n").find("line 1: not valid JSON"), std::string::npos);
  EXPECT_NE(error("{\"prompt_token_ids\": [1], \"output_len\": 0}\n").find("'output_len' must be an integer >= 1"),
            std::string::npos);
  EXPECT_NE(error("\n\n").find("holds no request"), std::string::npos);
  EXPECT_NE(error("{\"prompt_token_ids\": []}\n").find("a non-empty array"), std::string::npos);
  std::remove(path.c_str());
}

TEST(EngineWorkloads, SeededLengthsWithinSpecAndClipped) {
  WorkloadOptions o;
  o.seed = 5;
  o.vocab_size = 1000;
  o.max_model_len = 131072;
  Workload a = make_workload("balanced", o), b = make_workload("balanced", o);
  ASSERT_EQ(a.requests.size(), 1000u);
  int64_t in_sum = 0;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const Request& r = a.requests[i];
    EXPECT_EQ(r.prompt, b.requests[i].prompt);
    EXPECT_GE(int64_t(r.prompt.size()), 384);
    EXPECT_LE(int64_t(r.prompt.size()), 640);
    EXPECT_GE(r.sampling.max_tokens, 384);
    EXPECT_LE(r.sampling.max_tokens, 640);
    EXPECT_TRUE(r.sampling.ignore_eos && r.sampling.greedy());
    for (int64_t t : r.prompt) ASSERT_TRUE(t >= 0 && t < 1000);
    in_sum += int64_t(r.prompt.size());
  }
  EXPECT_NEAR(double(in_sum) / 1000.0, 512.0, 10.0);
  o.seed = 6;
  EXPECT_NE(make_workload("balanced", o).requests[0].prompt, a.requests[0].prompt);

  o.num_requests = 7;
  o.max_model_len = 300;
  o.scale = 0.5;
  Workload c = make_workload("long-context", o);
  ASSERT_EQ(c.requests.size(), 7u);
  EXPECT_EQ(c.clipped, 7);
  for (const Request& r : c.requests)
    EXPECT_LE(int64_t(r.prompt.size()) + r.sampling.max_tokens, 300) << r.prompt.size() << "+" << r.sampling.max_tokens;
  try {
    make_workload("nope", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("latency-b32"), std::string::npos) << e.what();
  }
}

TEST(EngineMetrics, LatenciesAndPercentiles) {
  Distribution d = summarize({4, 1, 3, 2, 5});
  EXPECT_DOUBLE_EQ(d.mean, 3.0);
  EXPECT_DOUBLE_EQ(d.p50, 3.0);
  EXPECT_DOUBLE_EQ(d.p90, 4.6);
  RequestOutput a, b;
  a.num_prompt_tokens = 10;
  a.tokens = {1, 2, 3};
  a.arrival_time = 100;
  a.token_times = {101, 102, 104};
  b.num_prompt_tokens = 6;
  b.tokens = {7};
  b.arrival_time = 100;
  b.token_times = {100.5};
  ServingMetrics m = compute_metrics({a, b}, 4.0, 9, 1);
  EXPECT_EQ(m.output_tokens, 4);
  EXPECT_DOUBLE_EQ(m.total_tokens_per_s, 20.0 / 4.0);
  EXPECT_DOUBLE_EQ(m.requests_per_s, 0.5);
  EXPECT_DOUBLE_EQ(m.ttft_s.mean, 0.75);
  EXPECT_EQ(m.tpot_s.count, 1);  // b has one token: no TPOT
  EXPECT_DOUBLE_EQ(m.tpot_s.mean, 1.5);
  EXPECT_EQ(m.itl_s.count, 2);
  EXPECT_DOUBLE_EQ(m.itl_s.p50, 1.5);
  EXPECT_DOUBLE_EQ(m.e2e_s.p50, 2.25);
}

// ---- the real tiny Llama on CPU ----

TEST(EngineModelRunner, ChunkedPrefillMetadata) {
  auto model = tiny_model();
  ModelRunner runner(*model, Variant::baseline, Device::cpu(), 4);
  runner.allocate_kv_cache(16);
  Sequence a, b;
  a.id = 0;
  a.prompt = {1, 2, 3, 4, 5, 6, 7};
  a.num_computed_tokens = 3;  // a chunk of 4 after 3 cached tokens
  a.block_table = {5, 2};
  b.id = 1;
  b.prompt = {9, 8};
  b.output = {7};
  b.num_computed_tokens = 2;
  b.block_table = {0};
  SchedulerOutput out;
  out.seqs = {{&a, 3, 4, true}, {&b, 2, 1, true}};
  out.num_prefills = 1;
  out.num_tokens = 5;
  StepInputs in = runner.prepare_inputs(out);
  EXPECT_EQ(in.input_ids.to_ints(), (std::vector<int64_t>{4, 5, 6, 7, 7}));
  EXPECT_EQ(in.positions.to_ints(), (std::vector<int64_t>{3, 4, 5, 6, 2}));
  EXPECT_EQ(in.metadata.slot_mapping.to_ints(), (std::vector<int64_t>{23, 8, 9, 10, 2}));
  EXPECT_EQ(in.metadata.query_start_loc.to_ints(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(in.metadata.seq_lens.to_ints(), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(in.metadata.block_tables.to_ints(), (std::vector<int64_t>{5, 2, 0, 0}));
  EXPECT_EQ(in.metadata.num_prefill_tokens, 4);
  EXPECT_EQ(in.metadata.num_decodes, 1);
  EXPECT_EQ(in.metadata.max_prefill_query_len, 4);
  EXPECT_EQ(in.metadata.max_prefill_seq_len, 7);
  EXPECT_EQ(in.metadata.max_decode_seq_len, 3);
  EXPECT_EQ(in.logit_rows, (std::vector<int64_t>{3, 4}));
  runner.profile_run(40, 3);  // the sizing step runs on CPU too
}

TEST(EngineLlama, GreedyTokensMatchHuggingFace) {
  std::ifstream f(kbn::test::fixture_dir() + "/tiny-llama/expected.json");
  const auto expected = nlohmann::json::parse(f);
  auto model = tiny_model();
  std::vector<Request> reqs;
  for (const auto& p : expected["prompts"])
    reqs.push_back(greedy_request(int64_t(reqs.size()), p["prompt_ids"].get<std::vector<int64_t>>(),
                                  int64_t(p["greedy_ids"].size())));
  EngineConfig cfg = small_config();
  cfg.block_size = 16;
  auto tokens = run_tokens(*model, cfg, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(tokens[i], expected["prompts"][i]["greedy_ids"].get<std::vector<int64_t>>()) << "prompt " << i;
}

TEST(EngineLlama, BatchedEqualsOneAtATimeAndGreedyGenerate) {
  auto model = tiny_model();
  const auto reqs = mixed_requests(8);
  auto batched = run_tokens(*model, small_config(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batched[i], run_tokens(*model, small_config(), {reqs[i]})[0]) << "request " << i;
    GenerateOptions g;
    g.max_new_tokens = 8;
    EXPECT_EQ(batched[i], generate_tokens(*model, {reqs[i].prompt}, Device::cpu(), Variant::baseline, g).tokens[0])
        << "request " << i;
  }
}

TEST(EngineLlama, ChunkedPrefillGivesTheSameTokens) {
  auto model = tiny_model();
  const auto reqs = mixed_requests(6);
  RunResult whole, chunked;
  auto a = run_tokens(*model, small_config(), reqs, &whole);
  EngineConfig cfg = small_config();
  cfg.max_num_batched_tokens = 5;  // the 23-token prompt takes 5 steps; decodes share steps with chunks
  auto b = run_tokens(*model, cfg, reqs, &chunked);
  EXPECT_EQ(a, b);
  EXPECT_GT(chunked.steps, whole.steps);
}

TEST(EngineLlama, PreemptedSequencesResumeWithTheSameTokens) {
  auto model = tiny_model();
  const auto reqs = mixed_requests(16);
  auto reference = run_tokens(*model, small_config(), reqs);
  EngineConfig cfg = small_config();
  cfg.num_kv_blocks = 10;  // 4-token blocks; the 23-token prompt alone grows to 10 blocks
  RunResult r;
  auto tokens = run_tokens(*model, cfg, reqs, &r);
  EXPECT_GT(r.preemptions, 0);
  EXPECT_TRUE(std::any_of(r.outputs.begin(), r.outputs.end(), [](const auto& o) { return o.num_preemptions > 0; }));
  EXPECT_EQ(tokens, reference);
}

TEST(EngineLlama, PrefixCacheHitsGiveTheSameTokens) {
  auto model = tiny_model();
  // Four requests behind one 18-token system prompt; the first runs alone, so the others find its blocks.
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int64_t> p;
    for (int64_t j = 0; j < 18; ++j) p.push_back((j * 37 + 11) % 512);
    for (int64_t j = 0; j <= 3 * i; ++j) p.push_back((i * 53 + j * 7 + 1) % 512);
    reqs.push_back(greedy_request(i, p, 8));
  }
  EngineConfig off = small_config();
  off.enable_prefix_caching = false;
  RunResult plain;
  const auto reference = run_tokens(*model, off, reqs, &plain);
  EXPECT_EQ(plain.cached_tokens, 0);

  LLMEngine engine(*model, Variant::baseline, Device::cpu(), small_config());
  const RunResult first = engine.run_to_completion({reqs[0]});
  const RunResult rest = engine.run_to_completion({reqs[1], reqs[2], reqs[3]});
  EXPECT_EQ(first.cached_tokens, 0);
  EXPECT_EQ(rest.cached_tokens, 3 * 16);  // four whole 4-token blocks of the system prompt each
  std::vector<std::vector<int64_t>> tokens = {first.outputs[0].tokens};
  for (const auto& o : rest.outputs) tokens.push_back(o.tokens);
  EXPECT_EQ(tokens, reference);
  EXPECT_EQ(rest.metrics().cached_tokens, 3 * 16);

  // Preemption with prefix caching on: the same tokens again.
  EngineConfig tight = small_config();
  tight.num_kv_blocks = 10;
  RunResult preempted;
  EXPECT_EQ(run_tokens(*model, tight, reqs, &preempted), reference);
  EXPECT_GT(preempted.preemptions, 0);
}

TEST(EngineStepProfile, AccountsForEveryStepTokenAndSecond) {
  auto model = tiny_model();
  const auto reqs = mixed_requests(6);
  EngineConfig cfg = small_config();
  cfg.max_num_batched_tokens = 5;  // partial chunks: steps in which nothing samples, prefills mixed with decodes
  cfg.profile_steps = true;
  RunResult r;
  const auto tokens = run_tokens(*model, cfg, reqs, &r);
  const StepKindTotals all = r.profile.total();
  EXPECT_EQ(all.steps, r.steps);
  EXPECT_EQ(r.profile.decode_graph.steps, 0);  // eager CPU run
  EXPECT_GT(r.profile.prefill.steps, 0);
  EXPECT_GT(r.profile.decode_eager.steps, 0);
  // Every prompt token is computed once (no preemption here), every output token but the last is fed back.
  int64_t prompt = 0, fed_back = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    prompt += int64_t(reqs[i].prompt.size());
    fed_back += int64_t(tokens[i].size()) - 1;
  }
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(all.tokens, prompt + fed_back);
  EXPECT_EQ(r.profile.decode_eager.prefill_tokens, 0);
  EXPECT_LE(all.prefill_tokens, prompt);  // a chunk of one prompt token is scheduled like a decode
  EXPECT_GT(all.prefill_tokens, 0);
  for (const StepKindTotals& k : {r.profile.prefill, r.profile.decode_eager}) {
    for (double v : {k.schedule_s, k.update_s, k.prepare_s, k.forward_s, k.logits_s, k.sample_s}) EXPECT_GE(v, 0.0);
    EXPECT_GT(k.forward_s, 0.0);
    EXPECT_NEAR(k.wall_s, k.schedule_s + k.prepare_s + k.forward_s + k.logits_s + k.sample_s + k.update_s,
                1e-6 + 1e-3 * k.wall_s);
  }
  EXPECT_LE(all.wall_s, r.end_time - r.start_time + 1e-6);  // the steps are inside the run

  // Off by default: nothing recorded, same tokens.
  RunResult plain;
  EngineConfig off = cfg;
  off.profile_steps = false;
  EXPECT_EQ(run_tokens(*model, off, reqs, &plain), tokens);
  EXPECT_EQ(plain.profile.total().steps, 0);
  EXPECT_EQ(plain.profile.total().wall_s, 0.0);
}

TEST(EngineLlama, SeededSamplingIsDeterministicAndTopKOneIsGreedy) {
  auto model = tiny_model();
  auto reqs = mixed_requests(10);
  const auto greedy = run_tokens(*model, small_config(), reqs);
  for (auto& r : reqs) {
    r.sampling.temperature = 1.0;
    r.sampling.seed = 1000 + uint64_t(r.id);
  }
  const auto a = run_tokens(*model, small_config(), reqs);
  EXPECT_EQ(a, run_tokens(*model, small_config(), reqs));
  // Counter-based draws: the same request alone gives the same tokens as in the batch.
  EXPECT_EQ(a[2], run_tokens(*model, small_config(), {reqs[2]})[0]);
  EXPECT_NE(a, greedy);
  auto reseeded = reqs;
  for (auto& r : reseeded) r.sampling.seed += 1;
  EXPECT_NE(run_tokens(*model, small_config(), reseeded), a);
  for (auto& r : reqs) r.sampling.top_k = 1;
  EXPECT_EQ(run_tokens(*model, small_config(), reqs), greedy);
}

TEST(EngineLlama, StopsAtEosUnlessIgnored) {
  auto model = tiny_model();
  Request r = greedy_request(0, {5, 6, 7}, 12);
  const auto full = run_tokens(*model, small_config(), {r})[0];
  ASSERT_EQ(full.size(), 12u);
  const int64_t eos = full[4];
  const auto first = std::find(full.begin(), full.end(), eos) - full.begin();
  r.sampling.eos_token_ids = {eos};
  EXPECT_EQ(run_tokens(*model, small_config(), {r})[0], full);  // ignore_eos is set
  r.sampling.ignore_eos = false;
  RunResult res;
  const auto stopped = run_tokens(*model, small_config(), {r}, &res)[0];
  EXPECT_EQ(stopped, std::vector<int64_t>(full.begin(), full.begin() + first + 1));
  EXPECT_EQ(res.outputs[0].finish_reason, FinishReason::eos);
  EXPECT_EQ(res.outputs[0].token_times.size(), stopped.size());
}

TEST(EngineLlama, RejectsBadRequests) {
  auto model = tiny_model();
  LLMEngine engine(*model, Variant::baseline, Device::cpu(), small_config());
  try {
    engine.add_request(greedy_request(0, {1, 512}, 4));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
  Request bad = greedy_request(1, {1}, 4);
  bad.sampling.top_p = 0.0;
  EXPECT_THROW(engine.add_request(bad), Error);
  engine.add_request(greedy_request(2, {1}, 4));
  EXPECT_THROW(engine.add_request(greedy_request(2, {3}, 4)), Error);  // duplicate id
  EXPECT_TRUE(engine.has_unfinished());
  while (engine.has_unfinished()) engine.step();
}

// ---- execution modes (CUDA graphs themselves run in tests/gpu/test_engine_graph.cpp) ----

TEST(EngineCudaGraphs, CaptureSizesFollowVllmAndCoverEveryDecodeBatch) {
  std::vector<int64_t> up_to_256 = {1, 2, 4};
  for (int64_t s = 8; s <= 256; s += 8) up_to_256.push_back(s);
  EXPECT_EQ(cuda_graph_capture_sizes(256, 8192), up_to_256);
  const auto capped = cuda_graph_capture_sizes(1024, 8192);
  EXPECT_EQ(capped.back(), 512);
  EXPECT_EQ(capped.size(), 3u + 64u);
  EXPECT_EQ(cuda_graph_capture_sizes(1, 8192), (std::vector<int64_t>{1}));
  EXPECT_EQ(cuda_graph_capture_sizes(3, 8192), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(cuda_graph_capture_sizes(13, 8192), (std::vector<int64_t>{1, 2, 4, 8, 13}));
  // The token budget bounds a decode batch too.
  EXPECT_EQ(cuda_graph_capture_sizes(256, 20), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
  for (int64_t seqs = 1; seqs <= 600; seqs += 7) {
    const auto sizes = cuda_graph_capture_sizes(seqs, 8192);
    EXPECT_TRUE(std::is_sorted(sizes.begin(), sizes.end()));
    EXPECT_EQ(sizes.back(), std::min<int64_t>(seqs, 512)) << "max_num_seqs " << seqs;
  }
  EXPECT_THROW(cuda_graph_capture_sizes(0, 8192), Error);
}

TEST(EngineCudaGraphs, ModeNamesAndGraphModeNeedsACudaDevice) {
  EXPECT_EQ(parse_execution_mode("eager"), ExecutionMode::eager);
  EXPECT_EQ(parse_execution_mode("graph"), ExecutionMode::graph);
  EXPECT_STREQ(execution_mode_name(ExecutionMode::graph), "graph");
  EXPECT_THROW(parse_execution_mode("compiled"), Error);

  auto model = tiny_model();
  EngineConfig cfg = small_config();
  cfg.mode = ExecutionMode::graph;
  try {
    LLMEngine engine(*model, Variant::baseline, Device::cpu(), cfg);
    FAIL() << "graph mode on CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graphs need a CUDA device"), std::string::npos) << e.what();
  }

  // Eager mode captures nothing and replays nothing.
  LLMEngine eager(*model, Variant::baseline, Device::cpu(), small_config());
  eager.run_to_completion(mixed_requests(3));
  EXPECT_EQ(eager.runner().cuda_graphs(), nullptr);
  EXPECT_EQ(eager.runner().num_graph_steps(), 0);
  EXPECT_EQ(eager.config().mode, ExecutionMode::eager);
}
