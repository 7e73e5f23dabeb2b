#include "configs/gemma3.h"

#include "kbn/error.h"

namespace kbn {

namespace {

// The rope of one layer type from transformers 5's {"rope_parameters": {"full_attention": {...}, ...}}.
RopeConfig rope_of_layer_type(const ModelConfig& params, const std::string& type, double default_theta) {
  const ModelConfig one = ModelConfig::parse("{\"rope_parameters\": " + params.sub(type).dump() + "}",
                                             params.source() + " rope_parameters." + type);
  return parse_rope_config(one, default_theta);
}

}  // namespace

Gemma3TextConfig Gemma3TextConfig::from(const ModelConfig& top) {
  const ModelConfig c = top.language_model();
  Gemma3TextConfig g;
  auto positive = [&](const char* key) {
    const int64_t v = c.get_int(key);
    KBN_CHECK(v > 0, "config ", c.source(), ": key '", key, "' must be positive, got ", v);
    return v;
  };
  g.vocab_size = positive("vocab_size");
  g.hidden_size = positive("hidden_size");
  g.intermediate_size = positive("intermediate_size");
  g.num_hidden_layers = positive("num_hidden_layers");
  g.num_attention_heads = positive("num_attention_heads");
  g.num_key_value_heads = c.get_int("num_key_value_heads", g.num_attention_heads);
  KBN_CHECK(g.num_key_value_heads > 0 && g.num_attention_heads % g.num_key_value_heads == 0, "config ", c.source(),
            ": 'num_attention_heads' (", g.num_attention_heads, ") must be a multiple of 'num_key_value_heads' (",
            g.num_key_value_heads, ")");
  g.head_dim = c.get_int("head_dim", 256);
  KBN_CHECK(g.head_dim > 0 && g.head_dim % 2 == 0, "config ", c.source(),
            ": key 'head_dim' must be positive and even for rotary embedding, got ", g.head_dim);
  g.max_position_embeddings = c.get_int("max_position_embeddings", 131072);
  KBN_CHECK(g.max_position_embeddings > 0, "config ", c.source(),
            ": key 'max_position_embeddings' must be positive, got ", g.max_position_embeddings);
  g.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  KBN_CHECK(g.rms_norm_eps > 0, "config ", c.source(), ": key 'rms_norm_eps' must be positive, got ", g.rms_norm_eps);
  g.query_pre_attn_scalar = c.get_double("query_pre_attn_scalar", 256);
  KBN_CHECK(g.query_pre_attn_scalar > 0, "config ", c.source(), ": key 'query_pre_attn_scalar' must be positive, got ",
            g.query_pre_attn_scalar);
  const std::string act = c.get_string("hidden_activation", c.get_string("hidden_act", "gelu_pytorch_tanh"));
  KBN_CHECK(act == "gelu_pytorch_tanh", "config ", c.source(),
            ": 'hidden_activation' must be \"gelu_pytorch_tanh\" for Gemma-3, got \"", act, "\"");
  KBN_CHECK(!c.has("final_logit_softcapping"), "config ", c.source(), ": 'final_logit_softcapping' is ",
            c.get_double("final_logit_softcapping", 0), ", but kb-nano's Gemma-3 applies none (Gemma-3's configs: null)");
  g.attn_logit_softcapping = c.get_double("attn_logit_softcapping", 0.0);
  KBN_CHECK(g.attn_logit_softcapping >= 0, "config ", c.source(), ": key 'attn_logit_softcapping' must be >= 0, got ",
            g.attn_logit_softcapping);
  g.tie_word_embeddings = c.get_bool("tie_word_embeddings", true);
  g.attention_bias = c.get_bool("attention_bias", false);
  g.initializer_range = c.get_double("initializer_range", 0.02);
  g.torch_dtype = c.get_string("torch_dtype", c.get_string("dtype", top.get_string("torch_dtype", "bfloat16")));
  g.eos_token_ids = c.get_int_list("eos_token_id");

  g.sliding_window = c.get_int("sliding_window", 4096);
  KBN_CHECK(g.sliding_window > 0, "config ", c.source(), ": key 'sliding_window' must be positive, got ",
            g.sliding_window);
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
    const int64_t pattern = c.get_int("sliding_window_pattern", 6);
    KBN_CHECK(pattern > 0, "config ", c.source(), ": key 'sliding_window_pattern' must be positive, got ", pattern);
    for (int64_t i = 0; i < g.num_hidden_layers; ++i) g.sliding.push_back((i + 1) % pattern != 0);
  }

  if (c.has("rope_parameters") && c.sub("rope_parameters").has("full_attention")) {
    const ModelConfig params = c.sub("rope_parameters");
    g.rope_global = rope_of_layer_type(params, "full_attention", 1e6);
    g.rope_local = params.has("sliding_attention") ? rope_of_layer_type(params, "sliding_attention", 1e4)
                                                   : RopeConfig{10000.0, {}};
  } else {
    g.rope_global = parse_rope_config(c, 1e6);
    g.rope_local.theta = c.get_double("rope_local_base_freq", 10000.0);
    KBN_CHECK(g.rope_local.theta > 0, "config ", c.source(), ": key 'rope_local_base_freq' must be positive, got ",
              g.rope_local.theta);
  }
  return g;
}

}  // namespace kbn
