#pragma once
// What the engine serves: a Request (prompt token ids + sampling parameters) and the Sequence that tracks it
// through the scheduler (waiting -> running -> finished, possibly back to waiting when preempted).
#include <cstdint>
#include <string>
#include <vector>

#include "kbn/error.h"

namespace kbn::engine {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy (argmax on the device)
  int64_t top_k = 0;         // keep the k most likely tokens; 0 or -1 = off
  double top_p = 1.0;        // keep the smallest top set whose probability reaches top_p; 1 = off
  uint64_t seed = 0;         // token i of the output is drawn from Philox(counter = i, key = seed)
  int64_t max_tokens = 16;   // new tokens at most
  bool ignore_eos = false;   // keep generating past an EOS token (benchmarks want fixed output lengths)
  std::vector<int64_t> eos_token_ids;

  bool greedy() const { return temperature == 0.0; }
  // Throws naming the field and the expected range.
  void validate() const;
};

struct Request {
  int64_t id = 0;  // unique among the requests an engine holds at one time
  std::vector<int64_t> prompt;
  SamplingParams sampling;
};

enum class SequenceStatus { waiting, running, finished };
enum class FinishReason { none, eos, max_tokens, max_model_len, aborted };
const char* finish_reason_name(FinishReason r);

// One request's state. Its tokens are prompt + output; the KV of the first num_computed_tokens of them is in
// the cache (blocks listed in block_table). Preemption by recompute frees the blocks and resets
// num_computed_tokens to 0: the output so far is kept and re-prefilled together with the prompt.
struct Sequence {
  int64_t id = 0;
  std::vector<int64_t> prompt;
  SamplingParams sampling;
  std::vector<int64_t> output;

  SequenceStatus status = SequenceStatus::waiting;
  FinishReason finish_reason = FinishReason::none;
  int64_t num_computed_tokens = 0;
  std::vector<int32_t> block_table;  // physical KV block of each logical block (KV cache group 0)
  // Models whose layers see different sliding windows: the tables of KV cache groups 1.. (BlockManager).
  std::vector<std::vector<int32_t>> more_block_tables;
  // Prefix caching (BlockManager): the leading full blocks whose chained hash is known, and that hash.
  int64_t num_hashed_blocks = 0;
  uint64_t block_hash = 0;
  int64_t num_preemptions = 0;
  // Models with recurrent-state layers: the state slot the sequence holds while running (-1 while waiting).
  int32_t state_slot = -1;

  // Steady-clock seconds: arrival, then one stamp per output token (the first one is the TTFT end).
  double arrival_time = 0;
  std::vector<double> token_times;
  double finish_time = 0;

  Sequence() = default;
  Sequence(const Request& r, double arrival);

  // Async scheduling (LLMEngine): tokens sampled by a step still in flight, whose ids are not on the host yet. They
  // count as tokens (the next step is scheduled on them; the model runner takes their ids on the device) and follow
  // the output; at most one per sequence when a step is scheduled.
  int64_t num_pending = 0;

  int64_t num_tokens() const { return int64_t(prompt.size() + output.size()) + num_pending; }
  // Tokens whose ids the host has: the prompt and the output, not the pending ones.
  int64_t num_known_tokens() const { return int64_t(prompt.size() + output.size()); }
  int64_t token(int64_t i) const {
    KBN_CHECK(i >= 0 && i < num_known_tokens(), "sequence ", id, ": token ", i, " of ", num_tokens(),
              (i >= num_known_tokens() && i < num_tokens() ? " is still being sampled on the device" : " is out of range"));
    return i < int64_t(prompt.size()) ? prompt[size_t(i)] : output[size_t(i) - prompt.size()];
  }
  // Tokens whose KV still has to be computed before the next token can be sampled.
  int64_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
};

}  // namespace kbn::engine
