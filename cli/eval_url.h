#pragma once
// kb_nano eval --url: a running OpenAI-compatible server measured as `vllm bench serve` does. Requests are sent as
// token-id prompts to /v1/completions, streamed, at Poisson arrival times (--request-rate; inf = all at once), at
// most --max-concurrency in flight; each one's time to first token (TTFT), time per output token after the first
// (TPOT), the gaps between its streamed chunks (ITL) and its end-to-end latency (E2EL) are summarised as mean,
// median, p90 and p99 over the successful requests.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace kbn::cli {

struct ServerInfo {
  std::string model;
  int64_t max_model_len = 0;  // 0 when the server does not say
  int64_t vocab_size = 0;     // kb-nano's servers say; others do not (0)
};

// GET <url>/v1/models: the first model. Throws naming the URL when it cannot be reached or answers otherwise.
ServerInfo query_server(const std::string& url);

struct UrlRunOptions {
  std::string url;
  std::string model;          // sent as "model"
  double request_rate = 0;    // requests per second; 0 = infinite (all at once)
  int64_t max_concurrency = 0;  // 0 = no limit
  uint64_t seed = 0;          // the arrival process's
  std::string workload;       // its name, for the output
  std::string json, csv, command;
};

// Sends every request and prints the summary; exits non-zero (throws) when no request succeeded.
void measure_server(const UrlRunOptions& o, const std::vector<engine::Request>& requests);

}  // namespace kbn::cli
