#pragma once
// The typed view of a Mixtral config.json (HF MixtralConfig): Llama's attention fields (no q/k norm, no bias) and a
// sparse MoE MLP in every layer. Mixtral names its expert count num_local_experts and each expert's hidden size
// intermediate_size; the router always renormalizes its top-k weights. Sliding-window attention (a non-null
// sliding_window) is refused until kb-nano's attention has windows (Mixtral-8x7B v0.1 has none).
#include "configs/llama.h"

namespace kbn {

struct MixtralConfig : LlamaConfig {
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  // intermediate_size (inherited) is the size of one expert's MLP.

  // Errors name the key.
  static MixtralConfig from(const ModelConfig& c);
};

}  // namespace kbn
