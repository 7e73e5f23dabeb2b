#include "configs/llama.h"

#include "kbn/error.h"

namespace kbn {

LlamaConfig LlamaConfig::from(const ModelConfig& c) {
  LlamaConfig l;
  auto positive = [&](const char* key) {
    int64_t v = c.get_int(key);
    KBN_CHECK(v > 0, "config ", c.source(), ": key '", key, "' must be positive, got ", v);
    return v;
  };
  l.vocab_size = positive("vocab_size");
  l.hidden_size = positive("hidden_size");
  l.intermediate_size = positive("intermediate_size");
  l.num_hidden_layers = positive("num_hidden_layers");
  l.num_attention_heads = positive("num_attention_heads");
  l.num_key_value_heads = c.get_int("num_key_value_heads", l.num_attention_heads);
  KBN_CHECK(l.num_key_value_heads > 0 && l.num_attention_heads % l.num_key_value_heads == 0, "config ", c.source(),
            ": 'num_attention_heads' (", l.num_attention_heads, ") must be a multiple of 'num_key_value_heads' (",
            l.num_key_value_heads, ")");
  l.head_dim = c.get_int("head_dim", 0);
  if (l.head_dim == 0) {
    KBN_CHECK(l.hidden_size % l.num_attention_heads == 0, "config ", c.source(), ": 'hidden_size' (", l.hidden_size,
              ") must be a multiple of 'num_attention_heads' (", l.num_attention_heads, ") when 'head_dim' is absent");
    l.head_dim = l.hidden_size / l.num_attention_heads;
  }
  KBN_CHECK(l.head_dim > 0 && l.head_dim % 2 == 0, "config ", c.source(),
            ": head dimension must be positive and even for rotary embedding, got ", l.head_dim);
  l.max_position_embeddings = c.get_int("max_position_embeddings", 8192);
  KBN_CHECK(l.max_position_embeddings > 0, "config ", c.source(),
            ": key 'max_position_embeddings' must be positive, got ", l.max_position_embeddings);
  l.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  KBN_CHECK(l.rms_norm_eps > 0, "config ", c.source(), ": key 'rms_norm_eps' must be positive, got ", l.rms_norm_eps);
  l.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  l.attention_bias = c.get_bool("attention_bias", false);
  l.mlp_bias = c.get_bool("mlp_bias", false);
  l.initializer_range = c.get_double("initializer_range", 0.02);
  l.hidden_act = c.get_string("hidden_act", "silu");
  KBN_CHECK(l.hidden_act == "silu", "config ", c.source(), ": 'hidden_act' must be \"silu\" for Llama, got \"",
            l.hidden_act, "\"");
  l.torch_dtype = c.get_string("torch_dtype", c.get_string("dtype", "bfloat16"));
  l.eos_token_ids = c.get_int_list("eos_token_id");
  if (c.has("bos_token_id")) l.bos_token_id = c.get_int("bos_token_id");
  const RopeConfig rope = parse_rope_config(c, 10000.0);
  l.rope_theta = rope.theta;
  l.rope_scaling = rope.scaling;
  return l;
}

}  // namespace kbn
