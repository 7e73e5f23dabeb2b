#include "engine/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kbn::engine {

namespace {

// Sorted input; q in [0, 1].
double quantile(const std::vector<double>& v, double q) {
  const double at = q * double(v.size() - 1);
  const size_t lo = size_t(std::floor(at)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - double(lo));
}

}  // namespace

Distribution summarize(std::vector<double> values) {
  Distribution d;
  d.count = int64_t(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  d.p50 = quantile(values, 0.50);
  d.p90 = quantile(values, 0.90);
  d.p99 = quantile(values, 0.99);
  return d;
}

ServingMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s, int64_t steps,
                               int64_t preemptions) {
  ServingMetrics m;
  m.num_requests = int64_t(outputs.size());
  m.duration_s = duration_s;
  m.steps = steps;
  m.preemptions = preemptions;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestOutput& o : outputs) {
    m.prompt_tokens += o.num_prompt_tokens;
    m.output_tokens += int64_t(o.tokens.size());
    if (o.token_times.empty()) continue;
    ttft.push_back(o.token_times.front() - o.arrival_time);
    e2e.push_back(o.token_times.back() - o.arrival_time);
    // A one-token output has no time per output token (vLLM leaves it out too).
    if (o.token_times.size() > 1)
      tpot.push_back((o.token_times.back() - o.token_times.front()) / double(o.token_times.size() - 1));
    for (size_t i = 1; i < o.token_times.size(); ++i) itl.push_back(o.token_times[i] - o.token_times[i - 1]);
  }
  if (duration_s > 0) {
    m.output_tokens_per_s = double(m.output_tokens) / duration_s;
    m.total_tokens_per_s = double(m.prompt_tokens + m.output_tokens) / duration_s;
    m.requests_per_s = double(m.num_requests) / duration_s;
  }
  m.ttft_s = summarize(std::move(ttft));
  m.tpot_s = summarize(std::move(tpot));
  m.itl_s = summarize(std::move(itl));
  m.e2e_s = summarize(std::move(e2e));
  return m;
}

}  // namespace kbn::engine
