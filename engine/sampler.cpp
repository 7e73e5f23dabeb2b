#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kbn/rng.h"

namespace kbn::engine {

namespace {

// NaN sorts below every number, so it is never kept ahead of a real logit.
float ordered(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

int64_t argmax_row(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (ordered(logits[i]) > ordered(logits[best])) best = i;
  return best;
}

}  // namespace

int64_t sample_from_logits(const float* logits, int64_t vocab, const SamplingParams& p, int64_t output_index) {
  KBN_CHECK(vocab >= 1, "sample_from_logits: empty vocabulary");
  if (p.greedy()) return argmax_row(logits, vocab);
  const double max_logit = double(ordered(logits[argmax_row(logits, vocab)]));
  // Unnormalised probabilities exp((l - max) / T): the largest is 1, so nothing overflows.
  std::vector<double> w(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = ordered(logits[i]);
    w[size_t(i)] = std::isinf(l) && l < 0 ? 0.0 : std::exp((double(l) - max_logit) / p.temperature);
  }
  const double u = double(u32_to_unit(philox4x32_10(uint64_t(output_index), p.seed).v[0]));  // (0, 1]

  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  if (k == vocab && p.top_p >= 1.0) {
    // No filter: inverse CDF in token-id order, no sort needed.
    const double target = u * std::accumulate(w.begin(), w.end(), 0.0);
    double cum = 0.0;
    int64_t last = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (w[size_t(i)] <= 0.0) continue;
      cum += w[size_t(i)];
      last = i;
      if (cum >= target) return i;
    }
    return last;  // rounding left target a hair above the sum
  }

  // Most likely first, lower id first among equals.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t(0));
  auto more_likely = [&](int64_t a, int64_t b) {
    const float la = ordered(logits[a]), lb = ordered(logits[b]);
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  int64_t kept = k;
  if (p.top_p < 1.0) {
    double top_k_mass = 0.0;
    for (int64_t j = 0; j < k; ++j) top_k_mass += w[size_t(order[size_t(j)])];
    double cum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      cum += w[size_t(order[size_t(j)])];
      if (cum >= p.top_p * top_k_mass) {
        kept = j + 1;
        break;
      }
    }
  }
  double mass = 0.0;
  for (int64_t j = 0; j < kept; ++j) mass += w[size_t(order[size_t(j)])];
  const double target = u * mass;
  double cum = 0.0;
  for (int64_t j = 0; j < kept; ++j) {
    cum += w[size_t(order[size_t(j)])];
    if (cum >= target) return order[size_t(j)];
  }
  return order[size_t(kept - 1)];
}

Sampler::Sampler(Variant variant) : argmax_(registry(variant).get("argmax").make(OpArgs{"argmax", {}, {}})) {}

Tensor Sampler::argmax(const Tensor& logits) { return argmax_->call({logits})[0]; }

std::vector<int64_t> Sampler::sample(const Tensor& logits, const std::vector<const SamplingParams*>& params,
                                     const std::vector<int64_t>& output_index) {
  KBN_CHECK(logits.dim() == 2, "Sampler: logits must be [num_rows, vocab], got ", logits.str());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  KBN_CHECK(int64_t(params.size()) == n && int64_t(output_index.size()) == n, "Sampler: ", n, " logit rows but ",
            params.size(), " sampling params and ", output_index.size(), " output indices");
  if (n == 0) return {};
  const bool all_greedy =
      std::all_of(params.begin(), params.end(), [](const SamplingParams* p) { return p->greedy(); });
  const bool any_greedy =
      std::any_of(params.begin(), params.end(), [](const SamplingParams* p) { return p->greedy(); });
  std::vector<int64_t> tokens;
  if (any_greedy) tokens = argmax(logits).to_ints();
  if (all_greedy) return tokens;
  tokens.resize(size_t(n));
  // NOTE: the host path; see the header. One transfer for all rows of the step.
  const Tensor host = logits.to(Device::cpu()).to(DType::f32).contiguous();
  const float* rows = host.data<float>();
  for (int64_t r = 0; r < n; ++r)
    if (!params[size_t(r)]->greedy())
      tokens[size_t(r)] = sample_from_logits(rows + r * vocab, vocab, *params[size_t(r)], output_index[size_t(r)]);
  return tokens;
}

}  // namespace kbn::engine
