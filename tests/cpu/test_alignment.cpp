// Greedy alignment of candidate and baseline outputs, and the scoring of first divergences by the baseline's
// teacher-forced logits (engine/alignment.h): counts, the numbers of one divergence on hand-made logits, and on
// the tiny Llama a near-tie (the baseline's second choice) told apart from a token it ranks last.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/alignment.h"
#include "engine/generate.h"
#include "engine/model_loader.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

using Outputs = std::vector<std::vector<int64_t>>;

TEST(Alignment, CountsIdenticalRequestsAndCommonPrefixes) {
  const Outputs base{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 9}, {1, 2}};
  const Outputs cand{{1, 2, 3, 4}, {5, 6, 0, 8}, {0, 9}, {1, 2, 3}};
  const Alignment a = align(base, cand);
  EXPECT_EQ(a.requests, 4);
  EXPECT_EQ(a.exact, 1);  // a longer output is not a match, though the baseline's is its prefix
  EXPECT_EQ(a.prefix, (std::vector<int64_t>{4, 2, 0, 2}));
  EXPECT_EQ(a.min_prefix, 0);
  EXPECT_DOUBLE_EQ(a.mean_prefix, 2.0);
  EXPECT_DOUBLE_EQ(a.mean_prefix_frac, (1.0 + 0.5 + 0.0 + 1.0) / 4);
  EXPECT_THROW(align(base, Outputs{{1}}), std::exception);
  EXPECT_EQ(align({}, {}).min_prefix, 0);
}

TEST(Alignment, ScoresOneDivergenceFromItsLogits) {
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 2.5f, -1.0f};
  const Divergence d = score_divergence(logits.data(), 5, /*baseline*/ 1, /*candidate*/ 3);
  EXPECT_DOUBLE_EQ(d.margin, 0.5);
  EXPECT_DOUBLE_EQ(d.top_gap, 0.5);
  EXPECT_EQ(d.candidate_rank, 2);
  const double mean = 5.5 / 5, var = (0 + 9 + 1 + 6.25 + 1) / 5.0 - mean * mean;
  EXPECT_NEAR(d.logit_std, std::sqrt(var), 1e-12);
  const Divergence last = score_divergence(logits.data(), 5, 1, 4);
  EXPECT_EQ(last.candidate_rank, 5);
  EXPECT_DOUBLE_EQ(last.margin, 4.0);
  // The rerun may prefer the candidate's token: a negative margin, rank 1.
  const Divergence flipped = score_divergence(logits.data(), 5, 3, 1);
  EXPECT_DOUBLE_EQ(flipped.margin, -0.5);
  EXPECT_EQ(flipped.candidate_rank, 1);
  try {
    score_divergence(logits.data(), 5, 1, 5);
    FAIL() << "a token outside the vocabulary was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 5)"), std::string::npos) << e.what();
  }
}

class TinyLlamaDivergences : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-llama"), Variant::baseline,
                         {DType::f32, Device::cpu()}, 0);
    prompts_ = {{5, 6, 7}, {100, 3, 9, 44}, {11, 12}, {7, 7, 7, 7, 7}, {42}};
    GenerateOptions opt;
    opt.max_new_tokens = 6;
    base_ = generate_tokens(*model_, prompts_, Device::cpu(), Variant::baseline, opt).tokens;
  }
  // The logits the baseline gives the token after prompt i + the first p tokens of its output.
  std::vector<float> logits_at(size_t i, int64_t p) {
    std::vector<int64_t> seq = prompts_[i];
    seq.insert(seq.end(), base_[i].begin(), base_[i].begin() + p);
    GenerateOptions opt;
    opt.max_new_tokens = 1;
    opt.return_last_logits = true;
    return generate_tokens(*model_, {seq}, Device::cpu(), Variant::baseline, opt).last_logits.to_floats();
  }
  std::unique_ptr<CausalLM> model_;
  Outputs prompts_, base_;
};

TEST_F(TinyLlamaDivergences, SecondChoiceIsANearTieAndLastChoiceIsFarOff) {
  // Request 1 diverges at position 2 to the baseline's second choice, request 3 at position 0 to its last.
  Outputs cand = base_;
  const std::vector<float> l1 = logits_at(1, 2), l3 = logits_at(3, 0);
  std::vector<int64_t> order(l1.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l1[size_t(a)] > l1[size_t(b)]; });
  ASSERT_EQ(order[0], base_[1][2]) << "the teacher-forced rerun must pick the baseline's own token";
  cand[1][2] = order[1];
  cand[3][0] = std::min_element(l3.begin(), l3.end()) - l3.begin();
  ASSERT_NE(cand[3][0], base_[3][0]);

  const DivergenceSummary s = analyse_divergences(*model_, Device::cpu(), Variant::baseline, prompts_, base_, cand,
                                                  /*max_samples*/ 64, /*max_batch_tokens*/ 6);
  EXPECT_EQ(s.diverged, 2);
  ASSERT_EQ(s.scored, 2);
  const Divergence& near = s.samples[0];
  const Divergence& far = s.samples[1];
  EXPECT_EQ(near.request, 1);
  EXPECT_EQ(near.position, 2);
  EXPECT_EQ(near.candidate_rank, 2);
  EXPECT_GE(near.margin, 0);
  EXPECT_NEAR(near.margin, near.top_gap, 1e-5);
  EXPECT_EQ(far.request, 3);
  EXPECT_EQ(far.position, 0);
  EXPECT_EQ(far.candidate_rank, model_->vocab_size());
  EXPECT_GT(far.margin / far.logit_std, 2.0);  // the lowest of 1000s of logits sits several stds below the top
  EXPECT_GT(far.margin, 10 * near.margin);
  EXPECT_DOUBLE_EQ(s.rank2_fraction, 0.5);
  EXPECT_DOUBLE_EQ(s.max_margin, far.margin);
}

TEST_F(TinyLlamaDivergences, SamplesEvenlyAndSkipsLengthOnlyDifferences) {
  Outputs cand = base_;
  for (auto& c : cand) c[0] = (c[0] + 1) % model_->vocab_size();  // every request differs at its first token
  const DivergenceSummary two = analyse_divergences(*model_, Device::cpu(), Variant::baseline, prompts_, base_, cand,
                                                    /*max_samples*/ 2, /*max_batch_tokens*/ 1 << 20);
  EXPECT_EQ(two.diverged, 5);
  ASSERT_EQ(two.scored, 2);
  EXPECT_EQ(two.samples[0].request, 0);
  EXPECT_EQ(two.samples[1].request, 2);  // 5 requests, 2 samples: indices 0 and 5/2

  const DivergenceSummary none = analyse_divergences(*model_, Device::cpu(), Variant::baseline, prompts_, base_,
                                                     base_, 64, 1 << 20);
  EXPECT_EQ(none.diverged, 0);
  EXPECT_EQ(none.scored, 0);

  Outputs longer = base_;
  longer[4].push_back(1);  // differs in length only: counted, not scored (no differing token to judge)
  const DivergenceSummary len = analyse_divergences(*model_, Device::cpu(), Variant::baseline, prompts_, base_,
                                                    longer, 64, 1 << 20);
  EXPECT_EQ(len.diverged, 1);
  EXPECT_EQ(len.scored, 0);
  EXPECT_THROW(analyse_divergences(*model_, Device::cpu(), Variant::baseline, prompts_, base_, cand, -1, 16),
               std::exception);
}

}  // namespace
