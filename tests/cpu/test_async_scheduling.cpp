// Async scheduling (EngineConfig::async_scheduling, issue 20: the idle time between steps): each greedy step is
// launched and the next one scheduled and launched before its ids reach the host, the next step taking them on the
// device (ModelRunner::launch / collect). What must hold: the tokens, finish reasons and token counts of synchronous
// steps for every family's tiny model (paged KV, sliding windows and sinks, MoE, MLA's latent cache, recurrent
// state) under chunked prefill, EOS (one discarded token), preemption, prefix caching, non-greedy rows (those steps
// run synchronously), nano-batches and an abort while a step is in flight; refusals by name. On the CPU the device
// work is done when launch() returns, so what this checks is the bookkeeping: pending tokens, their ids taken from the
// last launch's sampled tensor, the discarded entries, the sequences kept alive. The scheduler's side alone is the
// model-free property test in test_engine.cpp (drive(..., async = true)).
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "kbn/error.h"
#include "engine_requests.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

using kbn::test::chunked_config;
using kbn::test::mixed_requests;

struct Outcome {
  std::vector<RequestOutput> outputs;
  int64_t steps = 0, preemptions = 0, cached_tokens = 0;
};

Outcome run(CausalLM& model, EngineConfig cfg, const std::vector<Request>& reqs, bool async) {
  cfg.async_scheduling = async;
  LLMEngine engine(model, Variant::baseline, Device::cpu(), cfg);
  const RunResult r = engine.run_to_completion(reqs);
  EXPECT_EQ(engine.runner().num_launched(), 0) << "a launched step was left uncollected";
  engine.scheduler().check_invariants();
  return {r.outputs, r.steps, r.preemptions, r.cached_tokens};
}

void expect_same(const Outcome& async, const Outcome& sync, const std::string& what) {
  ASSERT_EQ(async.outputs.size(), sync.outputs.size()) << what;
  for (size_t i = 0; i < sync.outputs.size(); ++i) {
    const RequestOutput &a = async.outputs[i], &s = sync.outputs[i];
    EXPECT_EQ(a.tokens, s.tokens) << what << ", request " << s.id;
    EXPECT_EQ(a.finish_reason, s.finish_reason) << what << ", request " << s.id;
    EXPECT_EQ(a.token_times.size(), a.tokens.size()) << what << ", request " << s.id;
  }
}

}  // namespace

class AsyncSchedulingEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(AsyncSchedulingEngine, GivesTheTokensOfSynchronousSteps) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/" + GetParam());
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  std::vector<Request> reqs = mixed_requests(model->vocab_size(), true);
  const EngineConfig roomy = chunked_config(24, 512);
  const Outcome sync = run(*model, roomy, reqs, false);
  const Outcome async = run(*model, roomy, reqs, true);
  expect_same(async, sync, "roomy pool");
  // Ends known in advance (max_tokens) cost no extra step.
  EXPECT_EQ(async.steps, sync.steps);
  EXPECT_EQ(async.cached_tokens, sync.cached_tokens);

  // EOS: each request stops at the 4th token it generates (unless that token came earlier); the step already launched
  // for it computes one more token, which is discarded.
  std::vector<Request> eos = reqs;
  for (size_t i = 0; i < eos.size(); ++i) {
    eos[i].sampling.ignore_eos = false;
    eos[i].sampling.eos_token_ids = {sync.outputs[i].tokens[3]};
  }
  const Outcome eos_sync = run(*model, roomy, eos, false);
  const Outcome eos_async = run(*model, roomy, eos, true);
  expect_same(eos_async, eos_sync, "EOS");
  for (const RequestOutput& o : eos_sync.outputs) EXPECT_EQ(o.finish_reason, FinishReason::eos) << "request " << o.id;
  EXPECT_GE(eos_async.steps, eos_sync.steps);

  // A pool that holds the longest sequence and little more: preemption while ids are in flight. A model without pages
  // (Mamba-2) gets 2 state slots instead.
  const std::vector<LayerCacheSpec> specs = model->cache_specs();
  EngineConfig tight = chunked_config(24, 13 * int64_t(kv_cache_groups(specs).windows.size()));
  if (has_state_layers(specs)) tight.num_state_slots = 2;
  const Outcome tight_async = run(*model, tight, reqs, true);
  expect_same(tight_async, sync, "tight pool");
  if (!has_state_layers(specs)) {
    EXPECT_GT(tight_async.preemptions, 0);
  }

  // Non-greedy rows sample on the host, so their steps run synchronously; greedy ones around them do not.
  std::vector<Request> sampled = reqs;
  for (size_t i = 0; i < sampled.size(); i += 3) {
    sampled[i].sampling.temperature = 0.8;
    sampled[i].sampling.top_k = 5;
    sampled[i].sampling.seed = 77 + uint64_t(i);
  }
  expect_same(run(*model, roomy, sampled, true), run(*model, roomy, sampled, false), "mixed sampling");
  // ... with the greedy ones stopping at EOS: a synchronous step scheduled while a greedy one was in flight may hold a
  // sequence that step ended.
  for (size_t i = 0; i < sampled.size(); ++i)
    if (sampled[i].sampling.greedy()) sampled[i].sampling = eos[i].sampling;
  expect_same(run(*model, roomy, sampled, true), run(*model, roomy, sampled, false), "mixed sampling and EOS");

  // With nano-batches: a pending id is copied into the nano-batch that holds its sequence.
  EngineConfig nano = roomy;
  nano.nano_batching = {2, 1};
  expect_same(run(*model, nano, reqs, true), sync, "2 nano-batches");
}

INSTANTIATE_TEST_SUITE_P(Families, AsyncSchedulingEngine,
                         ::testing::ValuesIn(kbn::test::tiny_families()),
                         [](const auto& info) { return kbn::test::param_name(info.param); });

// Steps driven one at a time: an id is pending between steps, an abort of a request whose step is in flight discards
// its token, and the others still get their synchronous tokens.
TEST(AsyncScheduling, AbortWhileAStepIsInFlight) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  const std::vector<Request> reqs = mixed_requests(model->vocab_size(), true);
  const Outcome sync = run(*model, chunked_config(512, 512), reqs, false);
  EngineConfig cfg = chunked_config(512, 512);
  cfg.async_scheduling = true;
  LLMEngine engine(*model, Variant::baseline, Device::cpu(), cfg);
  for (const Request& r : reqs) engine.add_request(r);
  std::vector<RequestOutput> done;
  for (int i = 0; i < 3; ++i)
    for (RequestOutput& o : engine.step()) done.push_back(std::move(o));
  // Three steps: the prefill (its ids collected by the second), then two decodes, the last still in flight.
  EXPECT_EQ(engine.runner().num_launched(), 1);
  const Sequence* s2 = nullptr;
  for (const Sequence* s : engine.scheduler().running())
    if (s->id == 2) s2 = s;
  ASSERT_NE(s2, nullptr);
  EXPECT_EQ(s2->num_pending, 1);
  EXPECT_EQ(s2->output.size(), 2u);
  try {
    (void)s2->token(s2->num_tokens() - 1);
    FAIL() << "a pending token's id was read on the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is still being sampled on the device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.abort_request(2));
  EXPECT_FALSE(engine.abort_request(2));
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step()) done.push_back(std::move(o));
  EXPECT_EQ(engine.runner().num_launched(), 0);
  engine.scheduler().check_invariants();
  ASSERT_EQ(done.size(), reqs.size() - 1);
  for (const RequestOutput& o : done) {
    EXPECT_NE(o.id, 2);
    EXPECT_EQ(o.tokens, sync.outputs[size_t(o.id)].tokens) << "request " << o.id;
  }
  // Aborting every request while a step is in flight collects that step: nothing is left for a later run.
  for (const Request& r : reqs) engine.add_request(r);
  for (int i = 0; i < 3; ++i) engine.step();
  EXPECT_EQ(engine.runner().num_launched(), 1);
  for (const Request& r : reqs) EXPECT_TRUE(engine.abort_request(r.id));
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.runner().num_launched(), 0);
  const RunResult again = engine.run_to_completion({reqs[0]});
  EXPECT_EQ(again.outputs[0].tokens, sync.outputs[0].tokens);
}

// A greedy request decoding (its steps launched ahead) next to a sampled one whose chunked prompt reaches its first
// sample at every possible step, while the greedy one stops at EOS: some synchronous step is then scheduled while a
// greedy step is in flight and holds a sequence that step's EOS ends (its token is discarded, as in the async path).
TEST(AsyncScheduling, ASynchronousStepAfterAnEosInFlight) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  const std::vector<Request> base = mixed_requests(model->vocab_size());
  const Outcome plain = run(*model, chunked_config(8, 512), {base[4]}, false);
  Request greedy = base[4];  // 12 prompt tokens
  greedy.sampling.ignore_eos = false;
  greedy.sampling.eos_token_ids = {plain.outputs[0].tokens[5]};
  for (int64_t len = 1; len <= 40; ++len) {
    Request sampled = base[3];
    sampled.id = 9;
    sampled.prompt.resize(size_t(std::min<int64_t>(len, 37)));
    while (int64_t(sampled.prompt.size()) < len) sampled.prompt.push_back(len % 50);
    sampled.sampling.temperature = 0.7;
    sampled.sampling.seed = 5;
    const Outcome sync = run(*model, chunked_config(8, 512), {greedy, sampled}, false);
    expect_same(run(*model, chunked_config(8, 512), {greedy, sampled}, true), sync,
                "sampled prompt of " + std::to_string(len) + " tokens");
    EXPECT_EQ(sync.outputs[0].finish_reason, FinishReason::eos);
  }
}

TEST(AsyncScheduling, RefusedWithTensorParallelismOrStepProfiles) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  EngineConfig cfg = chunked_config(24, 64);
  cfg.async_scheduling = true;
  {
    TensorParallelGroup group(2, Device::cpu());
    const auto shards = build_model_shards(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0, group);
    try {
      LLMEngine engine({shards[0].get(), shards[1].get()}, group, Variant::baseline, cfg);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("async_scheduling needs tensor-parallel size 1, got 2"), std::string::npos)
          << e.what();
    }
  }
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  cfg.profile_steps = true;
  try {
    LLMEngine engine(*model, Variant::baseline, Device::cpu(), cfg);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("profile_steps times every step alone"), std::string::npos) << e.what();
  }
}
