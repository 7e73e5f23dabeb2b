#pragma once
// Canonical seeded serving workloads for `kb_nano eval`: random token ids (no tokenizer, no dataset), every
// length drawn uniformly within +-25% of the workload's mean (long-context: uniform in [8k, 32k]) from the
// seed, greedy sampling with ignore_eos so every request produces exactly its drawn output length. The same
// (name, seed, options) gives the same requests on every machine.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace kbn::engine {

struct WorkloadSpec {
  std::string name;
  std::string description;
  int64_t num_requests = 0;
  int64_t input_min = 0, input_max = 0;  // prompt lengths, uniform in [min, max]
  int64_t output_min = 0, output_max = 0;
  // Latency workloads: the batch size b. Their requests are sent in waves of b, each once the previous wave
  // has finished, so TTFT is the batch's prefill and not time spent queueing. 0 = all requests at once.
  int64_t max_num_seqs = 0;
};

// prefill-heavy, balanced, decode-heavy, long-context, latency-b1, latency-b32.
const std::vector<WorkloadSpec>& workload_specs();
// The error lists the known names.
const WorkloadSpec& workload_spec(const std::string& name);

struct WorkloadOptions {
  uint64_t seed = 0;
  int64_t num_requests = 0;   // 0 = the workload's count
  int64_t vocab_size = 0;     // token ids are drawn from [0, vocab_size)
  int64_t max_model_len = 0;  // prompt + output of every request fits: the output is clipped to max_model_len - 1,
                              // then the prompt to what is left
  double scale = 1.0;         // multiplies every length (> 0): shrinks a workload for a tiny model or the CPU
};

struct Workload {
  WorkloadSpec spec;  // as requested (before scale and clipping)
  std::vector<Request> requests;
  int64_t clipped = 0;  // requests whose lengths max_model_len shortened
};

Workload make_workload(const std::string& name, const WorkloadOptions& options);

}  // namespace kbn::engine
