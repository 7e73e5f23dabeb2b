// The engine's recurrent-state machinery (issue 19) with a model whose every token depends on a state carried from
// step to step: a running sum. Its state layer keeps s = (sum of the sequence's tokens so far) mod V in a state slot;
// its next token is (s + 1) mod V. Chunked prefill, decode, batching, slot reuse after a request finishes, preemption
// by recompute and slots fewer than max_num_seqs must all give exactly the closed-form tokens: a state read from
// the wrong slot, not carried across a chunk, or not restarted from zero on a reused slot changes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kbn/error.h"
#include "kbn/step_metadata.h"
#include "running_sum.h"

namespace {

using namespace kbn;
using namespace kbn::engine;

constexpr int64_t kVocab = 97;

class RunningSumLM : public CausalLM {
 public:
  Tensor forward(const Tensor& input_ids, const Tensor& positions) override {
    (void)positions;
    const ForwardContext& ctx = get_forward_context();
    const AttentionMetadata& md = *ctx.attn_metadata;
    KBN_CHECK(md.state_indices.defined() && md.has_initial_state.defined(), "RunningSumLM: no state slots given");
    Tensor& state = (*ctx.kv_caches)[1].states.at(0);  // [num_slots, 1]
    const std::vector<int64_t> ids = input_ids.to_ints(), slots = md.state_indices.to_ints(),
                               has = md.has_initial_state.to_ints(), qsl = md.query_start_loc.to_ints();
    std::vector<double> st = state.to_doubles();
    std::vector<float> hidden;
    size_t t = 0;
    const int64_t num_seqs = md.num_prefills + md.num_decodes;
    max_batch = std::max(max_batch, num_seqs);
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int64_t len = i < md.num_prefills ? qsl[size_t(i) + 1] - qsl[size_t(i)] : 1;
      double s = has[size_t(i)] ? st[size_t(slots[size_t(i)])] : 0.0;
      for (int64_t k = 0; k < len; ++k, ++t) {
        s = std::fmod(s + double(ids[t]), double(kVocab));
        hidden.push_back(float(s));
      }
      st[size_t(slots[size_t(i)])] = s;
    }
    state.copy_(Tensor::from_floats(std::vector<float>(st.begin(), st.end()), state.shape()));
    return Tensor::from_floats(hidden, {int64_t(hidden.size()), 1});
  }
  Tensor compute_logits(const Tensor& hidden) override { return test::running_sum_logits(hidden, kVocab); }
  void load_weights(const WeightSource&) override {}
  std::vector<LayerCacheSpec> cache_specs() const override {
    LayerCacheSpec state;
    state.kind = LayerCacheSpec::Kind::state;
    state.dtype = DType::f32;
    state.state_shapes = {{1}};
    if (extra_state_floats > 0) state.state_shapes.push_back({extra_state_floats});  // unused; sizing tests
    // A paged layer too (unused here) so that the KV blocks are real and preemption can be forced.
    return {LayerCacheSpec::paged_kv(1, 4, DType::f32), state};
  }
  int64_t vocab_size() const override { return kVocab; }
  int64_t max_batch = 0;  // the most sequences one step held
  int64_t extra_state_floats = 0;
};

std::vector<int64_t> expected_tokens(const std::vector<int64_t>& prompt, int64_t n) {
  return test::running_sum_tokens(prompt, n, kVocab);
}

std::vector<Request> requests(int64_t count) {
  std::vector<Request> rs;
  for (int64_t i = 0; i < count; ++i) {
    Request r;
    r.id = i;
    for (int64_t k = 0; k < 3 + (i * 7) % 29; ++k) r.prompt.push_back((i * 31 + k * 13) % kVocab);
    r.sampling.max_tokens = 5 + (i * 3) % 11;
    rs.push_back(r);
  }
  return rs;
}

void check_outputs(const RunResult& res, const std::vector<Request>& rs) {
  ASSERT_EQ(res.outputs.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i)
    EXPECT_EQ(res.outputs[i].tokens, expected_tokens(rs[i].prompt, rs[i].sampling.max_tokens)) << "request " << i;
}

EngineConfig config(int64_t budget, int64_t max_num_seqs, int64_t slots, int64_t blocks) {
  EngineConfig c;
  c.max_model_len = 128;
  c.block_size = 4;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_num_seqs;
  c.num_state_slots = slots;
  c.num_kv_blocks = blocks;
  return c;
}

TEST(StateEngine, ChunkedPrefillDecodeAndSlotReuseGiveTheClosedForm) {
  RunningSumLM model;
  // A budget of 8 tokens splits most prompts across steps; 4 slots for 24 requests reuse every slot many times.
  LLMEngine engine(model, Variant::baseline, Device::cpu(), config(8, 16, 4, 512));
  EXPECT_EQ(engine.config().num_state_slots, 4);
  EXPECT_EQ(engine.kv_cache_sizing().num_state_slots, 4);  // given blocks: the slots asked for
  EXPECT_FALSE(engine.config().enable_prefix_caching);  // a cached prefix has no state to resume from
  const std::vector<Request> rs = requests(24);
  const RunResult res = engine.run_to_completion(rs);
  check_outputs(res, rs);
  EXPECT_LE(model.max_batch, 4);  // never more running sequences than slots
  engine.scheduler().check_invariants();
}

TEST(StateEngine, StateSlotsAreSizedFromTheMemoryBudget) {
  RunningSumLM model;
  ModelRunner runner(model, Variant::baseline, Device::cpu(), 4);
  // Tiny states: one per possible running sequence.
  EXPECT_EQ(runner.auto_num_kv_blocks(64, 16, 128, 0.9).num_state_slots, 16);
  // 320 MB per sequence: as many as fit in the CPU's 1 GiB of cache, fewer than max_num_seqs.
  model.extra_state_floats = 80'000'000;
  EXPECT_EQ(runner.state_bytes_per_sequence(), 4 * (80'000'000 + 1));
  const KVCacheSizing s = runner.auto_num_kv_blocks(64, 16, 128, 0.9);
  EXPECT_EQ(s.num_state_slots, 3) << s.explanation;
  EXPECT_NE(s.explanation.find("3 slots"), std::string::npos) << s.explanation;
  EXPECT_EQ(runner.auto_num_kv_blocks(64, 16, 128, 0.9, 5).num_state_slots, 5);  // asked for: taken as given
  // The engine takes the sized slots when it sizes the cache itself.
  model.extra_state_floats = 0;
  LLMEngine engine(model, Variant::baseline, Device::cpu(), config(64, 16, 0, 0));
  EXPECT_EQ(engine.config().num_state_slots, 16);
  EXPECT_EQ(engine.kv_cache_sizing().num_state_slots, 16);
}

TEST(StateEngine, PreemptionRebuildsTheStateFromTheFirstToken) {
  RunningSumLM model;
  // 24 blocks of 4 tokens for requests of up to ~46 tokens, all running at once: some are preempted and recompute.
  LLMEngine engine(model, Variant::baseline, Device::cpu(), config(64, 16, 0, 24));
  EXPECT_EQ(engine.config().num_state_slots, 16);  // 0 = max_num_seqs
  const std::vector<Request> rs = requests(12);
  const RunResult res = engine.run_to_completion(rs);
  EXPECT_GT(res.preemptions, 0);
  check_outputs(res, rs);
  engine.scheduler().check_invariants();
}

TEST(StateEngine, AbortReturnsTheSlot) {
  RunningSumLM model;
  LLMEngine engine(model, Variant::baseline, Device::cpu(), config(64, 4, 2, 256));
  std::vector<Request> rs = requests(3);
  for (auto& r : rs) r.sampling.max_tokens = 40;
  for (const auto& r : rs) engine.add_request(r);
  engine.step();  // requests 0 and 1 hold the two slots, 2 waits
  EXPECT_EQ(engine.scheduler().num_running(), 2);
  EXPECT_TRUE(engine.abort_request(0));
  engine.scheduler().check_invariants();
  std::vector<RequestOutput> done;
  while (engine.has_unfinished())
    for (auto& o : engine.step()) done.push_back(std::move(o));
  ASSERT_EQ(done.size(), 2u);
  for (const auto& o : done) EXPECT_EQ(o.tokens, expected_tokens(rs[size_t(o.id)].prompt, 40)) << "request " << o.id;
}

TEST(StateEngine, GenerateTokensGivesEachPromptItsSlot) {
  RunningSumLM model;
  const std::vector<std::vector<int64_t>> prompts = {{5}, {1, 2, 3, 4, 5, 6, 7}, {90, 80}};
  GenerateOptions o;
  o.max_new_tokens = 9;
  const GenerateResult r = generate_tokens(model, prompts, Device::cpu(), Variant::baseline, o);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(r.tokens[i], expected_tokens(prompts[i], 9)) << "prompt " << i;
}

TEST(StateEngine, StepMetadataCarriesSlotsAndRefusesSharedOnes) {
  const std::vector<int32_t> table = {0, 1, 2};
  std::vector<StepSequence> seqs = {{0, 5, &table, true, 3}, {4, 2, &table, true, 0}, {7, 1, &table, false, 2}};
  const StepLayout l = build_step_layout(seqs, 4);
  EXPECT_EQ(l.state_indices, (std::vector<int32_t>{3, 0, 2}));
  EXPECT_EQ(l.has_initial_state, (std::vector<int32_t>{0, 1, 1}));
  auto error = [&](std::vector<StepSequence> s) {
    try {
      build_step_layout(s, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  seqs[2].state_slot = 3;
  EXPECT_NE(error(seqs).find("share state slot 3"), std::string::npos);
  seqs[2].state_slot = -1;
  EXPECT_NE(error(seqs).find("has no state slot while others do"), std::string::npos);
  // Without slots nothing is added.
  for (auto& s : seqs) s.state_slot = -1;
  EXPECT_TRUE(build_step_layout(seqs, 4).state_indices.empty());
}

TEST(StateEngine, NegativeOrMissingSlotsAreRefused) {
  RunningSumLM model;
  EngineConfig c = config(64, 4, 2, 64);
  c.num_state_slots = -1;
  try {
    LLMEngine engine(model, Variant::baseline, Device::cpu(), c);
    FAIL() << "negative num_state_slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_state_slots must be >= 0"), std::string::npos) << e.what();
  }
  try {
    allocate_kv_caches(model.cache_specs(), 4, 4, Device::cpu(), 0);
    FAIL() << "a state layer was allocated without slots";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 keeps a recurrent state"), std::string::npos) << e.what();
  }
  const auto caches = allocate_kv_caches(model.cache_specs(), 4, 4, Device::cpu(), 6);
  EXPECT_EQ(caches[1].states.at(0).shape(), (Shape{6, 1}));
}

}  // namespace

namespace {

// A one-token prompt's first step: a decode for an attention model (its one query attends its one key), a prefill
// for a recurrent-state model (the decode kernels continue a slot's state; only a prefill starts one from zero, and a
// reused slot holds its previous owner's state). A later one-token step of the same sequence is a decode in both.
TEST(StateEngine, AFirstTokenRunsAsAPrefillOnlyWithState) {
  for (const int64_t slots : {0, 2}) {
    SCOPED_TRACE("num_state_slots " + std::to_string(slots));
    BlockManager blocks(16, 4);
    SchedulerConfig cfg;
    cfg.max_model_len = 32;
    cfg.num_state_slots = slots;
    Scheduler sched(cfg, blocks);
    Request r;
    r.id = 7;
    r.prompt = {5};
    r.sampling.max_tokens = 3;
    sched.add(std::make_unique<Sequence>(r, 0.0));
    const SchedulerOutput first = sched.schedule();
    ASSERT_EQ(first.seqs.size(), 1u);
    EXPECT_EQ(first.num_prefills, slots > 0 ? 1 : 0);
    sched.update(first, {11}, 0.0);
    const SchedulerOutput second = sched.schedule();
    ASSERT_EQ(second.seqs.size(), 1u);
    EXPECT_EQ(second.num_prefills, 0);  // it continues its state now
  }
}

}  // namespace
