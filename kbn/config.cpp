#include "kbn/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kbn/error.h"

namespace kbn {

struct ModelConfig::Json {
  nlohmann::json j;
};

ModelConfig ModelConfig::parse(const std::string& json_text, const std::string& source) {
  ModelConfig c;
  c.source_ = source;
  auto j = std::make_shared<Json>();
  try {
    // Strict JSON: a config holding Infinity or NaN (some Mamba configs do) is refused with the parse position.
    j->j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    KBN_FAIL("config ", source, ": not valid JSON: ", e.what());
  }
  KBN_CHECK(j->j.is_object(), "config ", source, ": expected a JSON object at the top level");
  c.json_ = std::move(j);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::ifstream f(path);
  KBN_CHECK(f.good(), "config: cannot open '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

// A default-constructed ModelConfig holds no JSON: it has no keys rather than crashing.
bool ModelConfig::has(const std::string& key) const {
  return json_ && json_->j.contains(key) && !json_->j[key].is_null();
}

int64_t ModelConfig::get_int(const std::string& key) const {
  KBN_CHECK(has(key), "config ", source_, ": missing required key '", key, "'");
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_number_integer(), "config ", source_, ": key '", key, "' must be an integer, got ", v.dump());
  // Integers above INT64_MAX parse as unsigned and would wrap to negative values.
  KBN_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX), "config ", source_, ": key '", key,
            "' is out of range: ", v.dump());
  return v.get<int64_t>();
}

int64_t ModelConfig::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double ModelConfig::get_double(const std::string& key) const {
  KBN_CHECK(has(key), "config ", source_, ": missing required key '", key, "'");
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_number(), "config ", source_, ": key '", key, "' must be a number, got ", v.dump());
  return v.get<double>();
}

double ModelConfig::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

bool ModelConfig::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_boolean(), "config ", source_, ": key '", key, "' must be true or false, got ", v.dump());
  return v.get<bool>();
}

std::string ModelConfig::get_string(const std::string& key) const {
  KBN_CHECK(has(key), "config ", source_, ": missing required key '", key, "'");
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_string(), "config ", source_, ": key '", key, "' must be a string, got ", v.dump());
  return v.get<std::string>();
}

std::string ModelConfig::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<int64_t> ModelConfig::get_int_list(const std::string& key) const {
  if (!has(key)) return {};
  const auto& v = json_->j[key];
  if (v.is_number_integer()) return {v.get<int64_t>()};
  KBN_CHECK(v.is_array(), "config ", source_, ": key '", key, "' must be an integer or a list of integers, got ",
            v.dump());
  std::vector<int64_t> out;
  for (const auto& e : v) {
    KBN_CHECK(e.is_number_integer() && (!e.is_number_unsigned() || e.get<uint64_t>() <= uint64_t(INT64_MAX)), "config ",
              source_, ": key '", key, "' must hold integers, got ", v.dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<std::string> ModelConfig::architectures() const {
  std::vector<std::string> out;
  if (!has("architectures")) return out;
  const auto& v = json_->j["architectures"];
  KBN_CHECK(v.is_array(), "config ", source_, ": key 'architectures' must be a list of strings, got ", v.dump());
  for (const auto& e : v) {
    KBN_CHECK(e.is_string(), "config ", source_, ": key 'architectures' must be a list of strings, got ", v.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

ModelConfig ModelConfig::sub(const std::string& key) const {
  KBN_CHECK(has(key), "config ", source_, ": missing key '", key, "'");
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_object(), "config ", source_, ": key '", key, "' must be an object or null, got ", v.dump());
  ModelConfig c;
  c.source_ = source_ + " " + key;
  c.json_ = std::make_shared<Json>(Json{v});
  return c;
}

std::string ModelConfig::dump() const { return json_ ? json_->j.dump(2) : "{}"; }

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
  l.rope_theta = c.get_double("rope_theta", 10000.0);
  KBN_CHECK(l.rope_theta > 0, "config ", c.source(), ": key 'rope_theta' must be positive, got ", l.rope_theta);
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

  // transformers >= 5 saves "rope_parameters" (rope_theta inside it); earlier versions and the published Llama
  // configs save "rope_scaling" beside a top-level "rope_theta". Both spellings describe the same rope.
  const char* rope_key = c.has("rope_parameters") ? "rope_parameters"
                         : c.has("rope_scaling")  ? "rope_scaling"
                                                  : nullptr;
  if (rope_key) {
    ModelConfig rs = c.sub(rope_key);
    l.rope_theta = rs.get_double("rope_theta", l.rope_theta);
    KBN_CHECK(l.rope_theta > 0, "config ", c.source(), ": '", rope_key, ".rope_theta' must be positive, got ",
              l.rope_theta);
    l.rope_scaling.rope_type = rs.get_string("rope_type", rs.get_string("type", "default"));
    if (l.rope_scaling.rope_type == "llama3") {
      l.rope_scaling.factor = rs.get_double("factor");
      l.rope_scaling.low_freq_factor = rs.get_double("low_freq_factor");
      l.rope_scaling.high_freq_factor = rs.get_double("high_freq_factor");
      l.rope_scaling.original_max_position_embeddings = rs.get_int("original_max_position_embeddings");
      KBN_CHECK(l.rope_scaling.factor > 0 && l.rope_scaling.high_freq_factor > l.rope_scaling.low_freq_factor,
                "config ", c.source(), ": ", rope_key, " needs factor > 0 and high_freq_factor > low_freq_factor");
    } else {
      KBN_CHECK(l.rope_scaling.rope_type == "default", "config ", c.source(), ": ", rope_key, ".rope_type '",
                l.rope_scaling.rope_type, "' is not supported (supported: default, llama3)");
    }
  }
  return l;
}

}  // namespace kbn
