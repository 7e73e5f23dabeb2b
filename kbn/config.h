#pragma once
// HF config.json parsing. ModelConfig keeps the whole JSON (so any architecture can read its own keys) and
// typed accessors whose errors name the file and the key. Each family's typed view lives with its task files
// (tasks/configs/).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kbn/dtype.h"

namespace kbn {

// Frequency scaling of the rotary embedding (HF's rope_type names): "default" means none, "llama3" is the
// Llama-3.1 wavelength-band scaling, "linear" divides every frequency by `factor` (Gemma-3's global layers),
// "yarn" blends interpolated and original frequencies over the band between beta_fast and beta_slow rotations
// within original_max_position_embeddings and scales cos/sin by the attention factor (gpt-oss).
struct RopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // yarn only
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;         // floor/ceil the correction range (vLLM's and HF's default; gpt-oss sets false)
  double attention_factor = 0;  // cos/sin scale; 0: 0.1 ln(factor) + 1 (1 when factor <= 1)
  // DeepSeek's yarn keys (0: absent). With both mscale and mscale_all_dim the cos/sin scale is
  // yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) (transformers' rule, vLLM's
  // DeepseekScalingRotaryEmbedding), and MLA's softmax scale gains yarn_mscale(factor, mscale_all_dim)^2.
  double mscale = 0;
  double mscale_all_dim = 0;
};

// YaRN's magnitude correction 0.1 m ln(factor) + 1 (1 when factor <= 1): transformers' and vLLM's yarn_get_mscale.
double yarn_mscale(double factor, double m = 1.0);

// The rotary embedding a config describes: rope_theta and rope scaling, read from "rope_parameters"
// (transformers >= 5, theta inside) or "rope_scaling" beside a top-level "rope_theta" (earlier versions and
// the published configs). Errors name the key.
struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling;
};

class ModelConfig;
RopeConfig parse_rope_config(const ModelConfig& c, double default_theta);

class ModelConfig {
 public:
  // `source` names where the text came from, for error messages.
  static ModelConfig parse(const std::string& json_text, const std::string& source);
  static ModelConfig load(const std::string& path);

  const std::string& source() const { return source_; }
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // An int or a list of ints (eos_token_id is either).
  std::vector<int64_t> get_int_list(const std::string& key) const;
  // A list of numbers (Mamba-2's time_step_limit, which may hold Infinity); empty when absent.
  std::vector<double> get_double_list(const std::string& key) const;
  // A list of strings (layer_types); empty when absent.
  std::vector<std::string> get_string_list(const std::string& key) const;
  std::vector<std::string> architectures() const;
  // A nested object ("rope_scaling") as its own config; the error names the key when it is not an object.
  ModelConfig sub(const std::string& key) const;
  // The keys of this object, sorted (a nested object's from sub()).
  std::vector<std::string> keys() const;
  // The language model's config: "text_config" where a multimodal checkpoint nests it (Gemma-3's
  // Gemma3ForConditionalGeneration: no top-level hidden_size), else this config.
  ModelConfig language_model() const;
  std::string model_type() const { return get_string("model_type", ""); }
  std::string dump() const;
  // This config with the keys of `overrides` (a JSON object's text) written over it; the result names `source`.
  ModelConfig with_overrides(const std::string& overrides, const std::string& source) const;

 private:
  struct Json;
  std::shared_ptr<const Json> json_;
  std::string source_;
};

}  // namespace kbn
