#include "kbn/config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <string_view>
#include <limits>
#include <cctype>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kbn/error.h"

namespace kbn {

struct ModelConfig::Json {
  nlohmann::json j;
};

namespace {

// Sentinel strings standing for Python's non-finite constants while nlohmann parses the text.
constexpr const char* kPyConstants[][2] = {
    {"-Infinity", "\\u0001kbn:-Infinity"}, {"Infinity", "\\u0001kbn:Infinity"}, {"NaN", "\\u0001kbn:NaN"}};

// The text with each bare Infinity, -Infinity or NaN (outside strings) replaced by its quoted sentinel.
std::string with_python_constants(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) out += text[++i];
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
      out += ch;
      continue;
    }
    bool replaced = false;
    for (const auto& c : kPyConstants) {
      const std::string_view token = c[0];
      if (text.compare(i, token.size(), token) == 0) {
        const size_t end = i + token.size();
        const bool bounded = end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_');
        if (!bounded) continue;
        out += '"';
        out += c[1];
        out += '"';
        i = end - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += ch;
  }
  return out;
}

void restore_python_constants(nlohmann::json& j) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s == "\x01kbn:Infinity") j = std::numeric_limits<double>::infinity();
    else if (s == "\x01kbn:-Infinity") j = -std::numeric_limits<double>::infinity();
    else if (s == "\x01kbn:NaN") j = std::numeric_limits<double>::quiet_NaN();
  } else if (j.is_object() && j.size() == 1 && j.contains("__float__") && j["__float__"].is_string()) {
    // transformers 5 writes a non-finite float as {"__float__": "Infinity"} (its config.json of Mamba-2).
    const std::string s = j["__float__"].get<std::string>();
    if (s == "Infinity" || s == "inf") j = std::numeric_limits<double>::infinity();
    else if (s == "-Infinity" || s == "-inf") j = -std::numeric_limits<double>::infinity();
    else if (s == "NaN" || s == "nan") j = std::numeric_limits<double>::quiet_NaN();
  } else if (j.is_structured()) {
    for (auto& v : j) restore_python_constants(v);
  }
}

}  // namespace

ModelConfig ModelConfig::parse(const std::string& json_text, const std::string& source) {
  ModelConfig c;
  c.source_ = source;
  auto j = std::make_shared<Json>();
  try {
    // Python's json (which writes the published configs, and which transformers reads them with) allows the bare
    // tokens Infinity, -Infinity and NaN: Mamba-2's "time_step_limit": [0.0, Infinity]. They are read as those
    // doubles; anything else that is not JSON is refused with the parse position.
    j->j = nlohmann::json::parse(with_python_constants(json_text));
    restore_python_constants(j->j);
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

std::vector<double> ModelConfig::get_double_list(const std::string& key) const {
  if (!has(key)) return {};
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_array(), "config ", source_, ": key '", key, "' must be a list of numbers, got ", v.dump());
  std::vector<double> out;
  for (const auto& e : v) {
    KBN_CHECK(e.is_number(), "config ", source_, ": key '", key, "' must be a list of numbers, got ", v.dump());
    out.push_back(e.get<double>());
  }
  return out;
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

std::vector<std::string> ModelConfig::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const auto& v = json_->j[key];
  KBN_CHECK(v.is_array(), "config ", source_, ": key '", key, "' must be a list of strings, got ", v.dump());
  for (const auto& e : v) {
    KBN_CHECK(e.is_string(), "config ", source_, ": key '", key, "' must be a list of strings, got ", v.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<std::string> ModelConfig::architectures() const { return get_string_list("architectures"); }

ModelConfig ModelConfig::language_model() const {
  return has("text_config") && !has("hidden_size") ? sub("text_config") : *this;
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

std::vector<std::string> ModelConfig::keys() const {
  std::vector<std::string> out;
  if (!json_ || !json_->j.is_object()) return out;
  for (const auto& [key, value] : json_->j.items()) out.push_back(key);
  return out;
}

std::string ModelConfig::dump() const {
  if (!json_) return "{}";
  // Non-finite numbers are written as Python's json writes them (Infinity, -Infinity, NaN), which parse() reads back;
  // nlohmann alone would write null.
  nlohmann::json j = json_->j;
  std::function<void(nlohmann::json&)> mark = [&](nlohmann::json& v) {
    if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      const double d = v.get<double>();
      v = std::string(std::isnan(d) ? "\x01kbn:NaN" : d > 0 ? "\x01kbn:Infinity" : "\x01kbn:-Infinity");
    } else if (v.is_structured()) {
      for (auto& e : v) mark(e);
    }
  };
  mark(j);
  std::string text = j.dump(2);
  for (const auto& c : kPyConstants) {
    const std::string quoted = std::string("\"") + c[1] + "\"";
    for (size_t pos = text.find(quoted); pos != std::string::npos; pos = text.find(quoted, pos))
      text.replace(pos, quoted.size(), c[0]);
  }
  return text;
}

ModelConfig ModelConfig::with_overrides(const std::string& overrides, const std::string& source) const {
  ModelConfig o = parse(overrides, source);
  auto j = std::make_shared<Json>();
  j->j = json_ ? json_->j : nlohmann::json::object();
  for (const auto& [k, v] : o.json_->j.items()) j->j[k] = v;
  ModelConfig c;
  c.source_ = source;
  c.json_ = std::move(j);
  return c;
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

RopeConfig parse_rope_config(const ModelConfig& c, double default_theta) {
  RopeConfig r;
  r.theta = c.get_double("rope_theta", default_theta);
  KBN_CHECK(r.theta > 0, "config ", c.source(), ": key 'rope_theta' must be positive, got ", r.theta);
  const char* rope_key = c.has("rope_parameters") ? "rope_parameters"
                         : c.has("rope_scaling")  ? "rope_scaling"
                                                  : nullptr;
  if (!rope_key) return r;
  ModelConfig rs = c.sub(rope_key);
  r.theta = rs.get_double("rope_theta", r.theta);
  KBN_CHECK(r.theta > 0, "config ", c.source(), ": '", rope_key, ".rope_theta' must be positive, got ", r.theta);
  RopeScaling& s = r.scaling;
  s.rope_type = rs.get_string("rope_type", rs.get_string("type", "default"));
  if (s.rope_type == "llama3") {
    s.factor = rs.get_double("factor");
    s.low_freq_factor = rs.get_double("low_freq_factor");
    s.high_freq_factor = rs.get_double("high_freq_factor");
    s.original_max_position_embeddings = rs.get_int("original_max_position_embeddings");
    KBN_CHECK(s.factor > 0 && s.high_freq_factor > s.low_freq_factor, "config ", c.source(), ": ", rope_key,
              " needs factor > 0 and high_freq_factor > low_freq_factor");
  } else if (s.rope_type == "linear") {
    s.factor = rs.get_double("factor");
    KBN_CHECK(s.factor > 0, "config ", c.source(), ": ", rope_key, ".factor must be positive, got ", s.factor);
  } else if (s.rope_type == "yarn") {
    s.factor = rs.get_double("factor");
    s.original_max_position_embeddings = rs.get_int("original_max_position_embeddings");
    s.beta_fast = rs.get_double("beta_fast", 32.0);
    s.beta_slow = rs.get_double("beta_slow", 1.0);
    s.truncate = rs.get_bool("truncate", true);  // vLLM and HF default to true; gpt-oss's config says false
    s.attention_factor = rs.get_double("attention_factor", 0.0);
    s.mscale = rs.get_double("mscale", 0.0);
    s.mscale_all_dim = rs.get_double("mscale_all_dim", 0.0);
    KBN_CHECK(s.factor > 0, "config ", c.source(), ": ", rope_key, ".factor must be positive, got ", s.factor);
    KBN_CHECK(s.mscale >= 0 && s.mscale_all_dim >= 0, "config ", c.source(), ": ", rope_key,
              ".mscale and .mscale_all_dim must not be negative, got ", s.mscale, " and ", s.mscale_all_dim);
    if (s.attention_factor == 0 && s.mscale > 0 && s.mscale_all_dim > 0)
      s.attention_factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
    KBN_CHECK(s.original_max_position_embeddings > 0, "config ", c.source(), ": ", rope_key,
              ".original_max_position_embeddings must be positive, got ", s.original_max_position_embeddings);
    KBN_CHECK(s.beta_slow > 0 && s.beta_fast > s.beta_slow, "config ", c.source(), ": ", rope_key,
              " needs 0 < beta_slow < beta_fast, got beta_fast ", s.beta_fast, " and beta_slow ", s.beta_slow);
    KBN_CHECK(s.attention_factor >= 0, "config ", c.source(), ": ", rope_key,
              ".attention_factor must be positive when given, got ", s.attention_factor);
  } else {
    KBN_CHECK(s.rope_type == "default", "config ", c.source(), ": ", rope_key, ".rope_type '", s.rope_type,
              "' is not supported (supported: default, llama3, linear, yarn)");
  }
  return r;
}

}  // namespace kbn
