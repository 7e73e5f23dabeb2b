#include "configs/mamba2.h"

#include "kbn/error.h"

namespace kbn {

Mamba2Config Mamba2Config::from(const ModelConfig& c) {
  Mamba2Config m;
  auto positive = [&](const char* key, int64_t fallback) {
    const int64_t v = fallback > 0 ? c.get_int(key, fallback) : c.get_int(key);
    KBN_CHECK(v > 0, "config ", c.source(), ": key '", key, "' must be positive, got ", v);
    return v;
  };
  m.vocab_size = positive("vocab_size", 0);
  m.hidden_size = positive("hidden_size", 0);
  m.num_hidden_layers = positive("num_hidden_layers", 0);
  m.num_heads = positive("num_heads", 0);
  m.head_dim = positive("head_dim", 0);
  m.state_size = positive("state_size", 0);
  m.n_groups = positive("n_groups", 1);
  m.conv_kernel = positive("conv_kernel", 4);
  m.chunk_size = positive("chunk_size", 256);
  m.intermediate_size = m.num_heads * m.head_dim;
  if (c.has("intermediate_size"))
    KBN_CHECK(c.get_int("intermediate_size") == m.intermediate_size, "config ", c.source(), ": 'intermediate_size' (",
              c.get_int("intermediate_size"), ") must equal num_heads * head_dim (", m.intermediate_size, ")");
  KBN_CHECK(m.num_heads % m.n_groups == 0, "config ", c.source(), ": 'num_heads' (", m.num_heads,
            ") must be a multiple of 'n_groups' (", m.n_groups, ")");
  KBN_CHECK(m.conv_kernel >= 2, "config ", c.source(), ": 'conv_kernel' must be at least 2, got ", m.conv_kernel);
  KBN_CHECK((m.chunk_size & (m.chunk_size - 1)) == 0, "config ", c.source(),
            ": 'chunk_size' must be a power of two, got ", m.chunk_size);
  KBN_CHECK(c.get_bool("rms_norm", true), "config ", c.source(),
            ": 'rms_norm' is false; kb-nano's Mamba-2 has only the gated RMS norm (expected true)");
  const std::string act = c.get_string("hidden_act", "silu");
  KBN_CHECK(act == "silu" || act == "swish", "config ", c.source(), ": 'hidden_act' must be silu, got '", act, "'");
  m.use_bias = c.get_bool("use_bias", false);
  m.use_conv_bias = c.get_bool("use_conv_bias", true);
  m.layer_norm_epsilon = c.get_double("layer_norm_epsilon", 1e-5);
  KBN_CHECK(m.layer_norm_epsilon > 0, "config ", c.source(), ": 'layer_norm_epsilon' must be positive, got ",
            m.layer_norm_epsilon);
  m.residual_in_fp32 = c.get_bool("residual_in_fp32", true);
  m.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  m.initializer_range = c.get_double("initializer_range", 0.1);
  const std::vector<double> limit = c.get_double_list("time_step_limit");
  if (!limit.empty()) {
    KBN_CHECK(limit.size() == 2 && limit[0] >= 0 && limit[0] <= limit[1], "config ", c.source(),
              ": 'time_step_limit' must be [min, max] with 0 <= min <= max (Infinity allowed), got ", limit.size(),
              " numbers");
    m.time_step_min = limit[0];
    m.time_step_max = limit[1];
  }
  m.max_position_embeddings = c.get_int("max_position_embeddings", int64_t(1) << 20);
  return m;
}

}  // namespace kbn
