#pragma once
// Batched generation over a paged KV cache: one prefill step for all prompts, then one decode step per new token
// for the whole batch, greedy or sampled (engine/sampler.h). The simplest correct driver of an L4 model; the
// continuous-batching engine builds on the same metadata.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "kbn/causal_lm.h"
#include "kbn/registry.h"

namespace kbn::engine {

// Allocates each layer's cache from its declaration: paged K/V, [num_blocks, block_size, num_kv_heads, head_size]
// for K and for V (a sliding-window layer's too, in full: the blocks before its window are not yet returned); a
// recurrent state, one zeroed [num_state_slots, ...shape] tensor per entry of its state_shapes (num_state_slots
// must then be >= 1); a paged latent (MLA), one [num_blocks, block_size, latent_size] tensor whose rows follow the
// same block tables as K/V pages.
std::vector<KVCache> allocate_kv_caches(const std::vector<LayerCacheSpec>& specs, int64_t num_blocks,
                                        int64_t block_size, Device device, int64_t num_state_slots = 0);
// True when some layer keeps a recurrent state (its sequences need state slots).
bool has_state_layers(const std::vector<LayerCacheSpec>& specs);

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  int64_t block_size = 16;
  std::vector<int64_t> eos_token_ids;  // stop a sequence at any of these (kept in its output)
  bool return_prompt_logits = false;   // keep the logits of every prompt position
  bool return_last_logits = false;     // keep the logits of each prompt's last position (the first new token's)
  bool check_finite = false;           // every step's logits checked for NaN/Inf (engine/finite_check.h)
  std::string kv_cache_dtype = "auto";  // the paged K/V's dtype (EngineConfig::kv_cache_dtype)
  // How tokens are chosen (temperature 0: greedy, the default). Its seed is every prompt's: token j of each prompt's
  // output draws Philox(counter = j, key = seed). Its max_tokens and eos fields are unused (the two above rule).
  SamplingParams sampling;
  // Called with (prompt index, token) for every new token as soon as its step is done, in order (for streaming).
  std::function<void(size_t, int64_t)> on_token;
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> tokens;  // new tokens per prompt
  std::vector<Tensor> prompt_logits;         // per prompt [prompt_len, vocab] f32 on CPU, when asked
  Tensor last_logits;                        // [num_prompts, vocab] f32 on CPU, when asked
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
};

// `variant` picks the sampler's argmax implementation; the model itself was built from a variant already.
GenerateResult generate_tokens(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, Device device,
                               Variant variant, const GenerateOptions& options);

}  // namespace kbn::engine
