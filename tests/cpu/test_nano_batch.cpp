// Overlapped nano-batches (engine/nano_batch.h, issue 20 item 3): how a step splits (every sequence once, whole
// chunks, prefills first, token counts balanced, decodes in one run per nano-batch), and the engine giving the same
// greedy tokens with steps split into 2 or 3 nano-batches as with one batch, for every family's tiny model (paged KV,
// sliding windows and sinks, MoE, MLA's latent cache, recurrent state), under chunked prefill and preemption; and
// transformers' tokens for the tiny Llama. On the CPU the nano-batches run one after another: what this checks is
// the split and the gathering of the sampled rows, which are the same code on the GPU.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/nano_batch.h"
#include "kbn/error.h"
#include "engine_requests.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

// A step of `prefill` chunks (their lengths) then `decodes` one-token decodes; sequences are only identities here.
struct FakeStep {
  std::vector<Sequence> seqs;
  SchedulerOutput out;
  FakeStep(const std::vector<int64_t>& prefill, int64_t decodes) : seqs(prefill.size() + size_t(decodes)) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].id = int64_t(i);
      const bool p = i < prefill.size();
      const int64_t len = p ? prefill[i] : 1;
      out.seqs.push_back({&seqs[i], p ? 0 : 10, len, !p || i % 2 == 0});
      out.num_tokens += len;
    }
    out.num_prefills = int64_t(prefill.size());
  }
};

std::vector<int64_t> ids_of(const NanoBatch& b) {
  std::vector<int64_t> ids;
  for (const ScheduledSequence& e : b.out.seqs) ids.push_back(e.seq->id);
  return ids;
}

// What every split must hold: each sequence once with its whole chunk and flags, indices pointing back at it,
// prefills first with num_prefills and num_tokens right, no empty nano-batch, each nano-batch's decodes one run.
void check_partition(const SchedulerOutput& step, const std::vector<NanoBatch>& parts) {
  std::vector<int> seen(step.seqs.size(), 0);
  for (const NanoBatch& b : parts) {
    ASSERT_FALSE(b.out.empty());
    ASSERT_EQ(b.indices.size(), b.out.seqs.size());
    int64_t tokens = 0, prefills = 0;
    for (size_t j = 0; j < b.indices.size(); ++j) {
      const size_t i = b.indices[j];
      ASSERT_LT(i, step.seqs.size());
      ++seen[i];
      const ScheduledSequence &e = b.out.seqs[j], &s = step.seqs[i];
      EXPECT_EQ(e.seq, s.seq);
      EXPECT_EQ(e.num_computed_tokens, s.num_computed_tokens);
      EXPECT_EQ(e.num_new_tokens, s.num_new_tokens);
      EXPECT_EQ(e.samples, s.samples);
      if (j > 0) {
        EXPECT_LT(b.indices[j - 1], i) << "step order kept";
      }
      const bool prefill = int64_t(i) < step.num_prefills;
      if (prefill) {
        EXPECT_EQ(prefills, int64_t(j)) << "prefills first";
        ++prefills;
      } else if (j > 0 && int64_t(b.indices[j - 1]) >= step.num_prefills) {
        EXPECT_EQ(b.indices[j - 1] + 1, i) << "one run of decodes";
      }
      tokens += e.num_new_tokens;
    }
    EXPECT_EQ(b.out.num_prefills, prefills);
    EXPECT_EQ(b.out.num_tokens, tokens);
    EXPECT_TRUE(b.out.preempted_ids.empty());
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sequence " << i;
}

}  // namespace

TEST(NanoBatchSplit, BelowTheThresholdsTheStepStaysWhole) {
  FakeStep step({40, 30}, 6);  // 76 tokens, 8 sequences
  for (const NanoBatching nb : {NanoBatching{1, 1}, NanoBatching{2, 39}, NanoBatching{4, 20}}) {
    const auto parts = split_nano_batches(step.out, nb);
    ASSERT_EQ(parts.size(), 1u) << nb.count << " x " << nb.min_tokens;
    check_partition(step.out, parts);
  }
  FakeStep one({300}, 0);  // one sequence cannot split
  EXPECT_EQ(split_nano_batches(one.out, {2, 1}).size(), 1u);
}

TEST(NanoBatchSplit, DealsChunksLargestFirstAndDecodesAsOneRunEach) {
  FakeStep step({10, 50, 20, 30}, 8);  // ids 0..3 the chunks, 4..11 the decodes: 118 tokens
  const auto parts = split_nano_batches(step.out, {2, 1});
  ASSERT_EQ(parts.size(), 2u);
  check_partition(step.out, parts);
  // 50 -> A; 30 -> B; 20 -> B (50); 10 -> A on the tie, which has fewer sequences (60); the 8 decodes to the lighter B
  // (58). Each lists its sequences in step order.
  EXPECT_EQ(ids_of(parts[0]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ids_of(parts[1]), (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(parts[0].out.num_tokens, 60);
  EXPECT_EQ(parts[1].out.num_tokens, 58);
  // Three: 50 -> A, 30 -> B, 20 -> C, 10 -> C (30); the decodes alternate between B and C (ties to the fewer
  // sequences), 4 each, as contiguous runs: B the first four, C the last four.
  const auto three = split_nano_batches(step.out, {3, 1});
  ASSERT_EQ(three.size(), 3u);
  check_partition(step.out, three);
  EXPECT_EQ(ids_of(three[0]), (std::vector<int64_t>{1}));
  EXPECT_EQ(ids_of(three[1]), (std::vector<int64_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(ids_of(three[2]), (std::vector<int64_t>{0, 2, 8, 9, 10, 11}));
  EXPECT_EQ(three[1].out.num_tokens, 34);
  EXPECT_EQ(three[2].out.num_tokens, 34);
}

TEST(NanoBatchSplit, ByKindGivesChunksAndDecodesNanoBatchesOfTheirOwn) {
  FakeStep step({10, 50, 20, 30}, 8);  // ids 0..3 the chunks, 4..11 the decodes
  const auto two = split_nano_batches(step.out, {2, 1, NanoBatchSplit::by_kind});
  ASSERT_EQ(two.size(), 2u);
  check_partition(step.out, two);
  EXPECT_EQ(ids_of(two[0]), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ids_of(two[1]), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Four: two for the chunks (50 + 10, 30 + 20), two for the decodes (4 each, as runs).
  const auto four = split_nano_batches(step.out, {4, 1, NanoBatchSplit::by_kind});
  ASSERT_EQ(four.size(), 4u);
  check_partition(step.out, four);
  EXPECT_EQ(ids_of(four[0]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ids_of(four[1]), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ids_of(four[2]), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(ids_of(four[3]), (std::vector<int64_t>{8, 9, 10, 11}));
  // One decode and four nano-batches: the chunks take three.
  FakeStep few({10, 50, 20, 30}, 1);
  const auto parts = split_nano_batches(few.out, {4, 1, NanoBatchSplit::by_kind});
  ASSERT_EQ(parts.size(), 4u);
  check_partition(few.out, parts);
  EXPECT_EQ(ids_of(parts[3]), (std::vector<int64_t>{4}));
  // A decode-only step splits as balanced.
  FakeStep decodes({}, 6);
  const auto d = split_nano_batches(decodes.out, {2, 1, NanoBatchSplit::by_kind});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].out.num_tokens, 3);
  EXPECT_EQ(parse_nano_batch_split("kind", "x"), NanoBatchSplit::by_kind);
  EXPECT_EQ(parse_nano_batch_split("balanced", "x"), NanoBatchSplit::balanced);
  try {
    parse_nano_batch_split("even", "--nano-batch-split");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--nano-batch-split: expected balanced or kind, got 'even'"),
              std::string::npos);
  }
}

TEST(NanoBatchSplit, DecodeOnlyStepsSplitEvenly) {
  FakeStep step({}, 9);
  const auto parts = split_nano_batches(step.out, {3, 1});
  ASSERT_EQ(parts.size(), 3u);
  check_partition(step.out, parts);
  for (size_t p = 0; p < 3; ++p) {
    EXPECT_EQ(parts[p].out.num_tokens, 3);
    EXPECT_EQ(parts[p].indices.front(), 3 * p) << "nano-batch " << p << " holds the " << p << "th run";
  }
  // More nano-batches than sequences: one each, when each gets min_tokens.
  FakeStep two({}, 2);
  EXPECT_EQ(split_nano_batches(two.out, {4, 1}).size(), 2u);
  EXPECT_EQ(split_nano_batches(two.out, {4, 2}).size(), 1u);
}

TEST(NanoBatchSplit, BadSettingsAreNamed) {
  FakeStep step({}, 4);
  const auto message = [&](NanoBatching nb) {
    try {
      split_nano_batches(step.out, nb);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 1}).find("nano-batches per step must be 1 (off) .. 8, got 0"), std::string::npos)
      << message({0, 1});
  EXPECT_NE(message({9, 1}).find("got 9"), std::string::npos);
  EXPECT_NE(message({2, 0}).find("minimum tokens per nano-batch must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message({2, 1, NanoBatchSplit::balanced, -1}).find("GEMMs aim at must be >= 0 (0: all), got -1"),
            std::string::npos);
}

RC_GTEST_PROP(NanoBatchSplit, EverySplitIsAPartitionWithBalancedTokens, ()) {
  const auto prefill = *rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(2, 200));
  const int64_t decodes = *rc::gen::inRange<int64_t>(0, 40);
  RC_PRE(!prefill.empty() || decodes > 0);
  const NanoBatching nb{*rc::gen::inRange(1, 9), *rc::gen::inRange<int64_t>(1, 64),
                        *rc::gen::element(NanoBatchSplit::balanced, NanoBatchSplit::by_kind)};
  FakeStep step(prefill, decodes);
  const auto parts = split_nano_batches(step.out, nb);
  check_partition(step.out, parts);
  RC_ASSERT(!::testing::Test::HasFailure());
  const size_t n = step.out.seqs.size();
  const size_t want = std::min<size_t>(size_t(nb.count), n);
  const bool split = want > 1 && step.out.num_tokens >= int64_t(want) * nb.min_tokens;
  RC_ASSERT(parts.size() == (split ? want : 1u));
  if (nb.split == NanoBatchSplit::by_kind && !prefill.empty() && decodes > 0) {
    // By kind: no nano-batch holds both.
    for (const NanoBatch& b : parts)
      RC_ASSERT(b.out.num_prefills == 0 || b.out.num_prefills == int64_t(b.out.seqs.size()) || parts.size() == 1);
    return;
  }
  // Greedy dealing keeps every nano-batch within the largest chunk of the lightest.
  const int64_t largest = std::max<int64_t>(1, prefill.empty() ? 1 : *std::max_element(prefill.begin(), prefill.end()));
  int64_t lo = INT64_MAX, hi = 0;
  for (const NanoBatch& b : parts) {
    lo = std::min(lo, b.out.num_tokens);
    hi = std::max(hi, b.out.num_tokens);
  }
  RC_ASSERT(hi - lo <= largest);
}

namespace {

using kbn::test::chunked_config;
using kbn::test::greedy_request;
using kbn::test::mixed_requests;

struct Outcome {
  std::vector<std::vector<int64_t>> tokens;
  int64_t nano_steps = 0, steps = 0, preemptions = 0, staggered_starts = 0;
};

Outcome run(CausalLM& model, EngineConfig cfg, const std::vector<Request>& reqs, NanoBatching nb) {
  cfg.nano_batching = nb;
  LLMEngine engine(model, Variant::baseline, Device::cpu(), cfg);
  const RunResult r = engine.run_to_completion(reqs);
  Outcome out;
  for (const RequestOutput& o : r.outputs) out.tokens.push_back(o.tokens);
  out.nano_steps = engine.runner().num_nano_batched_steps();
  out.staggered_starts = engine.runner().num_staggered_starts();
  out.steps = r.steps;
  out.preemptions = r.preemptions;
  return out;
}


}  // namespace

class NanoBatchEngine : public ::testing::TestWithParam<std::string> {};

// Split steps give the tokens of whole ones, with steps that mix chunks and decodes, steps whose sequences all stop
// mid-prompt (nothing sampled), and (with a small pool) preemption by recompute.
TEST_P(NanoBatchEngine, SplitStepsGiveTheTokensOfWholeOnes) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/" + GetParam());
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  const auto reqs = mixed_requests(model->vocab_size());
  const EngineConfig roomy = chunked_config(24, 512);
  const Outcome whole = run(*model, roomy, reqs, {1, 1});
  EXPECT_EQ(whole.nano_steps, 0);
  for (const NanoBatching nb : {NanoBatching{2, 1}, NanoBatching{3, 1}, NanoBatching{2, 1, NanoBatchSplit::by_kind},
                                NanoBatching{4, 1, NanoBatchSplit::by_kind}}) {
    const std::string what = std::to_string(nb.count) + " nano-batches, " + nano_batch_split_name(nb.split);
    const Outcome split = run(*model, roomy, reqs, nb);
    EXPECT_EQ(split.tokens, whole.tokens) << what;
    EXPECT_EQ(split.steps, whole.steps);
    EXPECT_GT(split.nano_steps, split.steps / 2) << what;
    EXPECT_EQ(split.staggered_starts, 0) << what;
  }
  // Staggered starts: every nano-batch after the first waits for the one before to reach its first layer's attention
  // (or mixer): the family's layers call the forward context's layer hook, once per nano-batch step boundary here.
  NanoBatching staggered{3, 1};
  staggered.stagger = true;
  const Outcome st = run(*model, roomy, reqs, staggered);
  EXPECT_EQ(st.tokens, whole.tokens);
  EXPECT_GT(st.nano_steps, 0);
  EXPECT_GE(st.staggered_starts, st.nano_steps) << "a layer of this family does not call the layer hook";
  // A pool of 13 blocks of 4 tokens per KV cache group holds the longest sequence (47 tokens) and little more: the
  // rest wait, and running ones are preempted. A model without pages (Mamba-2) gets 2 state slots instead.
  const std::vector<LayerCacheSpec> specs = model->cache_specs();
  EngineConfig tight_cfg = chunked_config(24, 13 * int64_t(kv_cache_groups(specs).windows.size()));
  if (has_state_layers(specs)) tight_cfg.num_state_slots = 2;
  const Outcome tight = run(*model, tight_cfg, reqs, {2, 1});
  if (!has_state_layers(specs)) {
    EXPECT_GT(tight.preemptions, 0);
  }
  EXPECT_GT(tight.nano_steps, 0);
  EXPECT_EQ(tight.tokens, whole.tokens);
  // min_tokens: steps under 2 x 12 tokens (every decode-only step here) run whole.
  const Outcome thresholded = run(*model, roomy, reqs, {2, 12});
  EXPECT_EQ(thresholded.tokens, whole.tokens);
  EXPECT_LT(thresholded.nano_steps, run(*model, roomy, reqs, {2, 1}).nano_steps);
}

INSTANTIATE_TEST_SUITE_P(Families, NanoBatchEngine,
                         ::testing::ValuesIn(kbn::test::tiny_families()),
                         [](const auto& info) { return kbn::test::param_name(info.param); });

// The tiny Llama's transformers tokens, with every step of two or more sequences split.
TEST(NanoBatchEngine, TinyLlamaMatchesHuggingFace) {
  const std::string dir = kbn::test::fixture_dir() + "/tiny-llama";
  std::ifstream f(dir + "/expected.json");
  const auto expected = nlohmann::json::parse(f);
  auto model = build_model(resolve_model(dir), Variant::baseline, {DType::f32, Device::cpu()}, 0);
  std::vector<Request> reqs;
  for (const auto& p : expected["prompts"])
    reqs.push_back(
        greedy_request(int64_t(reqs.size()), p["prompt_ids"].get<std::vector<int64_t>>(), int64_t(p["greedy_ids"].size())));
  const Outcome r = run(*model, chunked_config(16, 512), reqs, {2, 1});
  EXPECT_GT(r.nano_steps, 0);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(r.tokens[i], expected["prompts"][i]["greedy_ids"].get<std::vector<int64_t>>()) << "prompt " << i;
}

TEST(NanoBatchEngine, TensorParallelIsRefusedByName) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  TensorParallelGroup group(2, Device::cpu());
  const auto shards = build_model_shards(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0, group);
  EngineConfig cfg = chunked_config(24, 64);
  cfg.nano_batching = {2, 1};
  try {
    LLMEngine engine({shards[0].get(), shards[1].get()}, group, Variant::baseline, cfg);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("nano_batching.count 2 (overlapped nano-batches) needs tensor-parallel size 1, "
                                   "got 2"),
        std::string::npos)
        << e.what();
  }
  cfg.nano_batching = {0, 1};
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  EXPECT_THROW(LLMEngine(*model, Variant::baseline, Device::cpu(), cfg), Error);
}
