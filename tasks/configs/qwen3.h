#pragma once
// The typed view of a Qwen3 dense config.json (HF Qwen3Config): Llama's fields, head_dim given (HF's default
// 128), no MLP bias, and sliding-window attention refused until kb-nano's attention has windows.
#include "configs/llama.h"

namespace kbn {

struct Qwen3Config : LlamaConfig {
  // Errors name the key.
  static Qwen3Config from(const ModelConfig& c);
};

}  // namespace kbn
