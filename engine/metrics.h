#pragma once
// Serving metrics of a finished run, as vLLM's benchmarks report them: throughput (output and total tokens/s,
// requests/s) and per-request latency distributions: TTFT (arrival -> first token), TPOT (per request,
// (last token time - first token time) / (tokens - 1)), ITL (every gap between consecutive tokens of a
// request) and end-to-end latency (arrival -> last token).
#include <cstdint>
#include <vector>

#include "engine/sequence.h"

namespace kbn::engine {

// What the engine returns for a finished request.
struct RequestOutput {
  int64_t id = 0;
  int64_t num_prompt_tokens = 0;
  std::vector<int64_t> tokens;  // generated tokens
  FinishReason finish_reason = FinishReason::none;
  int64_t num_preemptions = 0;
  double arrival_time = 0;          // steady-clock seconds
  std::vector<double> token_times;  // one per generated token
  double finish_time = 0;
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // linear interpolation between order statistics (numpy's default)
};
Distribution summarize(std::vector<double> values);

struct ServingMetrics {
  int64_t num_requests = 0;
  int64_t prompt_tokens = 0;  // each prompt counted once (recomputation after preemption is not throughput)
  int64_t output_tokens = 0;
  double duration_s = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;  // (prompt + output) / duration
  double requests_per_s = 0;
  Distribution ttft_s, tpot_s, itl_s, e2e_s;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;  // tokens whose KV the prefix cache gave at admission (computed by no step)
};

// `duration_s`: wall time of the whole run (first arrival to last finish, or as the caller measured it).
ServingMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s, int64_t steps,
                               int64_t preemptions);

}  // namespace kbn::engine
