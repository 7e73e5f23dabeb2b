#pragma once
// Greedy alignment of a candidate's outputs with the baseline's, and what the baseline thought of each first
// divergence. Two correct implementations that round differently still part ways wherever the model's top two
// logits are nearly tied, and a model with random weights has such near-ties everywhere, so the exact-match rate
// alone cannot tell a reordered reduction from a wrong kernel. At a request's first differing token, the
// baseline model is run again on the common prefix (teacher forcing) and asked how far apart its logits put the
// two tokens: a near-tie is rounding; a margin of a sizeable fraction of the logits' spread is a different model.
#include <cstdint>
#include <vector>

#include "kbn/causal_lm.h"
#include "kbn/registry.h"

namespace kbn::engine {

struct Alignment {
  int64_t requests = 0;
  int64_t exact = 0;            // requests whose outputs are identical
  double mean_prefix = 0;       // tokens
  double mean_prefix_frac = 0;  // of the baseline's output length
  int64_t min_prefix = 0;
  std::vector<int64_t> prefix;  // per request: the length of the common prefix of the two outputs
};

// Outputs per request, in the same request order. Outputs of different lengths count as different even when one
// is a prefix of the other.
Alignment align(const std::vector<std::vector<int64_t>>& baseline, const std::vector<std::vector<int64_t>>& candidate);

// One first divergence as the baseline's logits at that position see it.
struct Divergence {
  int64_t request = 0;
  int64_t position = 0;         // index in the output of the first differing token
  int64_t baseline_token = 0;
  int64_t candidate_token = 0;
  double margin = 0;            // logit[baseline_token] - logit[candidate_token]; < 0 if the rerun preferred it
  double logit_std = 0;         // standard deviation of the logits over the vocabulary
  double top_gap = 0;           // the largest logit minus the second largest
  int64_t candidate_rank = 0;   // 1 + number of tokens with a logit above the candidate's token
};

// `logits` of one position ([vocab] f32): the divergence's numbers. Checks that both tokens are in range.
Divergence score_divergence(const float* logits, int64_t vocab, int64_t baseline_token, int64_t candidate_token);

struct DivergenceSummary {
  int64_t diverged = 0;           // requests whose outputs differ
  int64_t scored = 0;             // of them, the ones scored (an evenly spaced sample of at most max_samples)
  double median_margin = 0, max_margin = 0;
  double median_margin_over_std = 0, max_margin_over_std = 0;  // margin / logit_std
  double rank2_fraction = 0;      // scored divergences where the candidate's token is the baseline's 1st or 2nd
  std::vector<Divergence> samples;
};

// Scores the first divergence of up to `max_samples` diverged requests (evenly spaced over them, so the result
// does not depend on which requests finished first) with `model`'s logits for prompt + common prefix, in
// prefill batches of at most `max_batch_tokens` tokens (one request larger than that runs alone). The model
// should be the baseline: its logits are the reference the candidate's choices are judged against.
DivergenceSummary analyse_divergences(CausalLM& model, Device device, Variant variant,
                                      const std::vector<std::vector<int64_t>>& prompts,
                                      const std::vector<std::vector<int64_t>>& baseline,
                                      const std::vector<std::vector<int64_t>>& candidate, int64_t max_samples,
                                      int64_t max_batch_tokens);

}  // namespace kbn::engine
