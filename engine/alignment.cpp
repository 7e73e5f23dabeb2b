#include "engine/alignment.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "engine/generate.h"
#include "kbn/checks.h"

namespace kbn::engine {

Alignment align(const std::vector<std::vector<int64_t>>& baseline, const std::vector<std::vector<int64_t>>& candidate) {
  KBN_CHECK(baseline.size() == candidate.size(), "align: ", baseline.size(), " baseline outputs but ",
            candidate.size(), " candidate outputs");
  Alignment a;
  a.requests = int64_t(baseline.size());
  a.min_prefix = a.requests > 0 ? INT64_MAX : 0;
  double frac = 0;
  for (size_t i = 0; i < baseline.size(); ++i) {
    const auto &x = baseline[i], &y = candidate[i];
    const int64_t p = std::mismatch(x.begin(), x.end(), y.begin(), y.end()).first - x.begin();
    a.prefix.push_back(p);
    a.exact += x == y;
    a.mean_prefix += double(p);
    frac += x.empty() ? 1.0 : double(p) / double(x.size());
    a.min_prefix = std::min(a.min_prefix, p);
  }
  if (a.requests > 0) {
    a.mean_prefix /= double(a.requests);
    a.mean_prefix_frac = frac / double(a.requests);
  }
  return a;
}

Divergence score_divergence(const float* logits, int64_t vocab, int64_t baseline_token, int64_t candidate_token) {
  KBN_CHECK(vocab >= 2, "score_divergence: need a vocabulary of at least 2 tokens, got ", vocab);
  KBN_CHECK(baseline_token >= 0 && baseline_token < vocab && candidate_token >= 0 && candidate_token < vocab,
            "score_divergence: tokens ", baseline_token, " and ", candidate_token, " must lie in [0, ", vocab, ")");
  Divergence d;
  d.baseline_token = baseline_token;
  d.candidate_token = candidate_token;
  const float lc = logits[candidate_token];
  d.margin = double(logits[baseline_token]) - double(lc);
  double sum = 0, sq = 0;
  float first = -INFINITY, second = -INFINITY;
  int64_t above = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const float l = logits[v];
    sum += double(l);
    sq += double(l) * double(l);
    above += l > lc;
    if (l > first) {
      second = first;
      first = l;
    } else if (l > second) {
      second = l;
    }
  }
  const double mean = sum / double(vocab);
  d.logit_std = std::sqrt(std::max(0.0, sq / double(vocab) - mean * mean));
  d.top_gap = double(first) - double(second);
  d.candidate_rank = above + 1;
  return d;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(m), v.end());
  const double hi = v[m];
  if (v.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + long(m)));
}

}  // namespace

DivergenceSummary analyse_divergences(CausalLM& model, Device device, Variant variant,
                                      const std::vector<std::vector<int64_t>>& prompts,
                                      const std::vector<std::vector<int64_t>>& baseline,
                                      const std::vector<std::vector<int64_t>>& candidate, int64_t max_samples,
                                      int64_t max_batch_tokens) {
  KBN_CHECK(prompts.size() == baseline.size() && baseline.size() == candidate.size(), "analyse_divergences: ",
            prompts.size(), " prompts, ", baseline.size(), " baseline and ", candidate.size(),
            " candidate outputs: expected one of each per request");
  KBN_CHECK(max_samples >= 0, "analyse_divergences: max_samples must be >= 0, got ", max_samples);
  KBN_CHECK(max_batch_tokens > 0, "analyse_divergences: max_batch_tokens must be > 0, got ", max_batch_tokens);
  DivergenceSummary s;
  // Requests whose outputs differ at a token both have (not merely in length), with that token.
  std::vector<Divergence> eligible;
  for (size_t i = 0; i < baseline.size(); ++i) {
    const auto &x = baseline[i], &y = candidate[i];
    if (x == y) continue;
    ++s.diverged;
    const size_t p = size_t(std::mismatch(x.begin(), x.end(), y.begin(), y.end()).first - x.begin());
    if (p == x.size() || p == y.size()) continue;
    Divergence d;
    d.request = int64_t(i);
    d.position = int64_t(p);
    d.baseline_token = x[p];
    d.candidate_token = y[p];
    eligible.push_back(d);
  }
  const int64_t n = std::min<int64_t>(max_samples, int64_t(eligible.size()));
  std::vector<Divergence> picked;
  for (int64_t k = 0; k < n; ++k) picked.push_back(eligible[size_t(k * int64_t(eligible.size()) / n)]);

  const int64_t vocab = model.vocab_size();
  for (size_t first = 0; first < picked.size();) {
    // One prefill batch: prompt + common prefix of each request, up to max_batch_tokens tokens.
    std::vector<std::vector<int64_t>> batch;
    int64_t tokens = 0;
    size_t next = first;
    for (; next < picked.size(); ++next) {
      const Divergence& d = picked[next];
      const auto& x = baseline[size_t(d.request)];
      std::vector<int64_t> seq = prompts[size_t(d.request)];
      seq.insert(seq.end(), x.begin(), x.begin() + long(d.position));
      if (!batch.empty() && tokens + int64_t(seq.size()) > max_batch_tokens) break;
      tokens += int64_t(seq.size());
      batch.push_back(std::move(seq));
    }
    GenerateOptions opt;
    opt.max_new_tokens = 1;
    opt.return_last_logits = true;
    const GenerateResult r = generate_tokens(model, batch, device, variant, opt);
    const Tensor logits = r.last_logits.contiguous();  // [batch, vocab] f32 on CPU
    KBN_CHECK(logits.dim() == 2 && logits.size(0) == int64_t(batch.size()) && logits.size(1) == vocab,
              "analyse_divergences: unexpected logits shape");
    const float* rows = logits.data<float>();
    for (size_t b = 0; b < batch.size(); ++b) {
      const Divergence& at = picked[first + b];
      Divergence d = score_divergence(rows + int64_t(b) * vocab, vocab, at.baseline_token, at.candidate_token);
      d.request = at.request;
      d.position = at.position;
      s.samples.push_back(d);
    }
    first = next;
  }

  s.scored = int64_t(s.samples.size());
  std::vector<double> margins, relative;
  int64_t rank2 = 0;
  for (const Divergence& d : s.samples) {
    margins.push_back(d.margin);
    relative.push_back(d.logit_std > 0 ? d.margin / d.logit_std : 0.0);
    rank2 += d.candidate_rank <= 2;
  }
  if (s.scored > 0) {
    s.median_margin = median(margins);
    s.max_margin = *std::max_element(margins.begin(), margins.end());
    s.median_margin_over_std = median(relative);
    s.max_margin_over_std = *std::max_element(relative.begin(), relative.end());
    s.rank2_fraction = double(rank2) / double(s.scored);
  }
  return s;
}

}  // namespace kbn::engine
