#pragma once
// The typed view of a Mamba-2 config.json (HF Mamba2Config, model_type "mamba2"; Mamba-Codestral-7B).
#include <cmath>
#include <cstdint>

#include "kbn/config.h"

namespace kbn {

struct Mamba2Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // num_heads * head_dim (expand * hidden_size)
  int64_t state_size = 0;         // N
  int64_t n_groups = 1;           // groups of B and C
  int64_t conv_kernel = 4;
  int64_t chunk_size = 256;
  bool use_bias = false;       // in_proj and out_proj
  bool use_conv_bias = true;
  double layer_norm_epsilon = 1e-5;
  bool residual_in_fp32 = true;  // the residual stream between layers is kept in fp32
  bool tie_word_embeddings = false;
  double time_step_min = 0.0, time_step_max = INFINITY;  // 'time_step_limit': the clamp of dt'
  double initializer_range = 0.1;
  int64_t max_position_embeddings = 0;  // none in the config (a recurrent model has no position limit): 1 << 20

  int64_t conv_dim() const { return intermediate_size + 2 * n_groups * state_size; }

  // Errors name the key. 'rms_norm' must be true and 'hidden_act' silu; 'norm_before_gate' is read by neither HF's
  // Mamba2 nor vLLM's MambaMixer2 (both gate before the norm), so it is not either.
  static Mamba2Config from(const ModelConfig& c);
};

}  // namespace kbn
