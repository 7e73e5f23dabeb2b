#include "configs/qwen3.h"

#include "kbn/error.h"

namespace kbn {

Qwen3Config Qwen3Config::from(const ModelConfig& c) {
  KBN_CHECK(!c.get_bool("use_sliding_window", false), "config ", c.source(),
            ": 'use_sliding_window' is true; kb-nano's Qwen3 has no sliding-window attention yet (expected false)");
  KBN_CHECK(!c.has("mlp_bias") || !c.get_bool("mlp_bias", false), "config ", c.source(),
            ": 'mlp_bias' is true, but Qwen3's MLP has no bias");
  Qwen3Config q;
  static_cast<LlamaConfig&>(q) = LlamaConfig::from(c);
  q.head_dim = c.get_int("head_dim", 128);
  KBN_CHECK(q.head_dim > 0 && q.head_dim % 2 == 0, "config ", c.source(),
            ": key 'head_dim' must be positive and even for rotary embedding, got ", q.head_dim);
  return q;
}

}  // namespace kbn
