#include "configs/mixtral.h"

#include "kbn/error.h"

namespace kbn {

MixtralConfig MixtralConfig::from(const ModelConfig& c) {
  KBN_CHECK(!c.has("sliding_window"), "config ", c.source(), ": key 'sliding_window' is ",
            c.get_int("sliding_window", 0),
            "; kb-nano's Mixtral has no sliding-window attention yet (expected null, as Mixtral-8x7B v0.1 has)");
  KBN_CHECK(!c.get_bool("mlp_bias", false), "config ", c.source(), ": key 'mlp_bias' is true, but Mixtral's experts have no bias");
  MixtralConfig m;
  static_cast<LlamaConfig&>(m) = LlamaConfig::from(c);
  m.num_local_experts = c.get_int("num_local_experts");
  KBN_CHECK(m.num_local_experts > 0, "config ", c.source(), ": key 'num_local_experts' must be positive, got ",
            m.num_local_experts);
  m.num_experts_per_tok = c.get_int("num_experts_per_tok");
  KBN_CHECK(m.num_experts_per_tok > 0 && m.num_experts_per_tok <= m.num_local_experts, "config ", c.source(),
            ": key 'num_experts_per_tok' must be in [1, num_local_experts = ", m.num_local_experts, "], got ",
            m.num_experts_per_tok);
  return m;
}

}  // namespace kbn
