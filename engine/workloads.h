#pragma once
// Canonical seeded serving workloads for `kb_nano eval`: random token ids (no tokenizer, no dataset), every
// length drawn uniformly within +-25% of the workload's mean (long-context: uniform in [8k, 32k]) from the
// seed, greedy sampling with ignore_eos so every request produces exactly its drawn output length. The same
// (name, seed, options) gives the same requests on every machine.
#include <cstdint>
#include <functional>
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
  // A dataset's text prompts -> token ids (the model's tokenizer, with its special tokens); empty: text prompts are
  // refused naming the line.
  std::function<std::vector<int64_t>(const std::string&)> encode;
};

struct Workload {
  WorkloadSpec spec;  // as requested (before scale and clipping)
  std::vector<Request> requests;
  int64_t clipped = 0;  // requests whose lengths max_model_len shortened
};

Workload make_workload(const std::string& name, const WorkloadOptions& options);
// The same generator on a spec built elsewhere (random_workload_spec).
Workload make_workload(const WorkloadSpec& spec, const WorkloadOptions& options);

// vLLM's random dataset (`vllm bench throughput|serve --dataset-name random --random-input-len N --random-output-len
// M --num-prompts K --random-range-ratio R`): K requests whose prompt lengths are uniform in [floor(N (1 - R)),
// floor(N (1 + R))] and output lengths likewise, all sent at once; R in [0, 1). Named "random"; errors name the flag.
WorkloadSpec random_workload_spec(int64_t input_len, int64_t output_len, int64_t num_prompts, double range_ratio);

// A dataset of prompts, one JSON object per line (JSONL; blank lines skipped):
//   {"prompt_token_ids": [1, 2, 3], "output_len": 64}   or   {"prompt": "text", "output_len": 64}
// "output_len" (or "max_tokens") is optional: default_output_len then. A text "prompt" is encoded with
// options.encode (refused naming the line when there is none). Ids must lie in [0, vocab_size). options.num_requests > 0 keeps the first that
// many lines; options.scale and max_model_len apply as in make_workload. Named "dataset".
Workload load_dataset_workload(const std::string& path, int64_t default_output_len, const WorkloadOptions& options);

}  // namespace kbn::engine
