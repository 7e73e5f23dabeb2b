#include "configs/gpt_oss.h"

#include <algorithm>
#include <cmath>

#include "kbn/error.h"

namespace kbn {

GptOssConfig GptOssConfig::from(const ModelConfig& c) {
  GptOssConfig g;
  static_cast<LlamaConfig&>(g) = LlamaConfig::from(c);
  g.attention_bias = c.get_bool("attention_bias", true);
  g.num_local_experts = c.get_int("num_local_experts");
  KBN_CHECK(g.num_local_experts > 0, "config ", c.source(), ": key 'num_local_experts' must be positive, got ",
            g.num_local_experts);
  g.num_experts_per_tok = c.get_int("num_experts_per_tok", c.get_int("experts_per_token", 4));
  KBN_CHECK(g.num_experts_per_tok > 0 && g.num_experts_per_tok <= g.num_local_experts, "config ", c.source(),
            ": key 'num_experts_per_tok' must be in [1, num_local_experts = ", g.num_local_experts, "], got ",
            g.num_experts_per_tok);
  if (c.has("experts_per_token"))
    KBN_CHECK(c.get_int("experts_per_token") == g.num_experts_per_tok, "config ", c.source(),
              ": 'experts_per_token' (", c.get_int("experts_per_token"), ") and 'num_experts_per_tok' (",
              g.num_experts_per_tok, ") disagree");
  g.swiglu_limit = c.get_double("swiglu_limit", 7.0);
  KBN_CHECK(g.swiglu_limit > 0 && std::isfinite(g.swiglu_limit), "config ", c.source(),
            ": key 'swiglu_limit' must be positive and finite, got ", g.swiglu_limit);
  g.swiglu_alpha = c.get_double("swiglu_alpha", 1.702);
  KBN_CHECK(std::isfinite(g.swiglu_alpha), "config ", c.source(), ": key 'swiglu_alpha' must be finite, got ",
            g.swiglu_alpha);

  const std::vector<std::string> types = c.get_string_list("layer_types");
  if (!types.empty()) {
    KBN_CHECK(int64_t(types.size()) == g.num_hidden_layers, "config ", c.source(), ": 'layer_types' lists ",
              types.size(), " layers but 'num_hidden_layers' is ", g.num_hidden_layers);
    for (size_t i = 0; i < types.size(); ++i) {
      KBN_CHECK(types[i] == "sliding_attention" || types[i] == "full_attention", "config ", c.source(),
                ": 'layer_types'[", i, "] is \"", types[i], "\"; expected \"sliding_attention\" or \"full_attention\"");
      g.sliding.push_back(types[i] == "sliding_attention");
    }
  } else {
    for (int64_t i = 0; i < g.num_hidden_layers; ++i) g.sliding.push_back(i % 2 == 0);  // vLLM's gpt-oss rule
  }
  const bool any_sliding = std::find(g.sliding.begin(), g.sliding.end(), true) != g.sliding.end();
  if (any_sliding) {
    KBN_CHECK(c.has("sliding_window"), "config ", c.source(),
              ": 'layer_types' has sliding layers but key 'sliding_window' is missing or null");
    g.sliding_window = c.get_int("sliding_window");
    KBN_CHECK(g.sliding_window > 0, "config ", c.source(), ": key 'sliding_window' must be positive, got ",
              g.sliding_window);
  }
  return g;
}

}  // namespace kbn
