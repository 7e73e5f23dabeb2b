#pragma once
// The typed view of a Llama config.json (HF LlamaConfig) that the Llama task files build from.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kbn/config.h"

namespace kbn {

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  std::string hidden_act = "silu";
  std::string torch_dtype = "bfloat16";
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;

  // Validates everything a Llama model relies on; errors name the key.
  static LlamaConfig from(const ModelConfig& c);
};

}  // namespace kbn
