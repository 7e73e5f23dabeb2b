#pragma once
// What the CPU engine tests of nano-batches and async scheduling share: greedy requests of mixed prompt lengths and a
// small paged cache with chunked prefill, so that steps mix prefill chunks with decodes and some sample nothing.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace kbn::test {

// A greedy request that ignores EOS: exactly max_tokens out.
inline engine::Request greedy_request(int64_t id, std::vector<int64_t> prompt, int64_t max_tokens) {
  engine::Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Eight prompts of 1 to 37 tokens (ids below `vocab`), 10 tokens each. shared_stem: the last two (16 and 30 tokens)
// start with the same 16 tokens, which prefix caching can find.
inline std::vector<engine::Request> mixed_requests(int64_t vocab, bool shared_stem = false) {
  std::vector<engine::Request> reqs;
  const std::vector<int64_t> lens = {7, 1, 23, 37, 12, 5, 16, 30};
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<int64_t> p;
    for (int64_t j = 0; j < lens[i]; ++j)
      p.push_back(shared_stem && i >= 6 && j < 16 ? (j * 37 + 11) % vocab : (int64_t(i) * 97 + j * 31 + 5) % vocab);
    reqs.push_back(greedy_request(int64_t(i), p, 10));
  }
  return reqs;
}

// Sequences of up to 128 tokens in 4-token blocks, `blocks` of them, and a step budget of `budget` tokens.
inline engine::EngineConfig chunked_config(int64_t budget, int64_t blocks) {
  engine::EngineConfig c;
  c.max_model_len = 128;
  c.block_size = 4;
  c.num_kv_blocks = blocks;
  c.max_num_batched_tokens = budget;
  return c;
}

// Every family's tiny model (tests/fixtures/<name>): paged KV, sliding windows and sinks, MoE, MLA's latent cache,
// recurrent state.
inline const std::vector<std::string>& tiny_families() {
  static const std::vector<std::string> names = {"tiny-llama", "tiny-qwen3",   "tiny-qwen3-moe",   "tiny-mixtral",
                                                 "tiny-gpt-oss", "tiny-gemma3", "tiny-deepseek-v2", "tiny-mamba2"};
  return names;
}

// A fixture's name as a gtest parameter name (no dashes).
inline std::string param_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace kbn::test
