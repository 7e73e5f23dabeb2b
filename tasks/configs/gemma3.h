#pragma once
// The typed view of a Gemma-3 text config (HF Gemma3TextConfig, model_type "gemma3_text"), or of the language model
// a Gemma3ForConditionalGeneration config nests in "text_config".
#include <cstdint>
#include <string>
#include <vector>

#include "kbn/config.h"

namespace kbn {

struct Gemma3TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 256;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double query_pre_attn_scalar = 256;  // attention scale = query_pre_attn_scalar^-1/2
  int64_t sliding_window = 0;          // of the sliding layers
  std::vector<bool> sliding;           // per layer: true for "sliding_attention", false for "full_attention"
  RopeConfig rope_global;              // full-attention layers: rope_theta and rope_scaling (linear x8 on 12B)
  RopeConfig rope_local;               // sliding layers: rope_local_base_freq, no scaling
  double attn_logit_softcapping = 0;   // 0: none (Gemma-3's configs: null)
  bool tie_word_embeddings = true;
  bool attention_bias = false;
  double initializer_range = 0.02;
  std::string torch_dtype = "bfloat16";
  std::vector<int64_t> eos_token_ids;

  // Errors name the key. Layer types come from 'layer_types' when given, else from 'sliding_window_pattern' (every
  // pattern-th layer full, default 6); the ropes from 'rope_theta' / 'rope_scaling' / 'rope_local_base_freq' or
  // transformers 5's 'rope_parameters' keyed by layer type.
  static Gemma3TextConfig from(const ModelConfig& c);
};

}  // namespace kbn
