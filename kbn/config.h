#pragma once
// HF config.json parsing. ModelConfig keeps the whole JSON (so any architecture can read its own keys) and
// typed accessors whose errors name the file and the key. LlamaConfig is the typed view Llama models use.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kbn/dtype.h"

namespace kbn {

// Llama-3.1 style frequency scaling ("rope_type": "llama3"); rope_type "default" means no scaling.
struct RopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

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
  std::vector<std::string> architectures() const;
  // A nested object ("rope_scaling") as its own config; the error names the key when it is not an object.
  ModelConfig sub(const std::string& key) const;
  std::string model_type() const { return get_string("model_type", ""); }
  std::string dump() const;

 private:
  struct Json;
  std::shared_ptr<const Json> json_;
  std::string source_;
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  std::string hidden_act = "silu";
  std::string torch_dtype = "bfloat16";
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;

  // Validates everything a Llama model relies on; errors name the key.
  static LlamaConfig from(const ModelConfig& c);
};

}  // namespace kbn
