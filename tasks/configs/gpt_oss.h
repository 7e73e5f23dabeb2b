#pragma once
// The typed view of a gpt-oss config.json (HF GptOssConfig): Llama's attention fields with biases (attention_bias),
// YaRN rope, sliding-window layers (layer_types; vLLM's rule without it: even layers slide), attention sinks, and a
// sparse MoE in every layer: num_local_experts experts of intermediate_size, num_experts_per_tok of them per token
// (renormalized softmax over the chosen logits), swigluoai activation with swiglu_limit and biases.
#include <vector>

#include "configs/llama.h"

namespace kbn {

struct GptOssConfig : LlamaConfig {
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t sliding_window = 0;  // the window of the sliding layers
  std::vector<bool> sliding;   // per layer
  double swiglu_limit = 7.0;   // the experts' clamp
  double swiglu_alpha = 1.702;

  // Errors name the key and the value.
  static GptOssConfig from(const ModelConfig& c);
};

}  // namespace kbn
