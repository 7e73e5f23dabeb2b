#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <unistd.h>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "configs/llama.h"
#include "engine/model_loader.h"
#include "kbn/config.h"
#include "kbn/error.h"
#include "kbn/registry.h"
#include "test_errors.h"

using namespace kbn;
using kbn::test::error_of;

namespace {

std::string model_config_path(const std::string& name) {
  const char* env = std::getenv("KBN_MODELS_DIR");
  return (env ? std::string(env) : std::string(KBN_SOURCE_DIR) + "/models") + "/" + name + ".json";
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

struct ExpectedLlama {
  std::string name;
  int64_t hidden_size, intermediate_size, num_attention_heads, num_hidden_layers, head_dim;
  double rope_factor;
  bool tie_word_embeddings;
};

}  // namespace

TEST(Config, RealLlamaConfigs) {
  const std::vector<ExpectedLlama> models = {
      {"llama-3.1-8b-instruct", 4096, 14336, 32, 32, 128, 8.0, false},
      {"llama-3.1-70b-instruct", 8192, 28672, 64, 80, 128, 8.0, false},
      {"llama-3.2-1b-instruct", 2048, 8192, 32, 16, 64, 32.0, true},
  };
  for (const auto& m : models) {
    SCOPED_TRACE(m.name);
    const std::string path = model_config_path(m.name);
    ModelConfig c = ModelConfig::load(path);
    EXPECT_EQ(c.source(), path);
    EXPECT_EQ(c.model_type(), "llama");
    EXPECT_EQ(c.architectures(), (std::vector<std::string>{"LlamaForCausalLM"}));

    LlamaConfig l = LlamaConfig::from(c);
    EXPECT_EQ(l.hidden_size, m.hidden_size);
    EXPECT_EQ(l.intermediate_size, m.intermediate_size);
    EXPECT_EQ(l.num_attention_heads, m.num_attention_heads);
    EXPECT_EQ(l.num_key_value_heads, 8);
    EXPECT_EQ(l.num_hidden_layers, m.num_hidden_layers);
    EXPECT_EQ(l.head_dim, m.head_dim);
    EXPECT_EQ(l.vocab_size, 128256);
    EXPECT_EQ(l.max_position_embeddings, 131072);
    EXPECT_DOUBLE_EQ(l.rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(l.rope_theta, 500000.0);
    EXPECT_EQ(l.rope_scaling.rope_type, "llama3");
    EXPECT_DOUBLE_EQ(l.rope_scaling.factor, m.rope_factor);
    EXPECT_DOUBLE_EQ(l.rope_scaling.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(l.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(l.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
    ASSERT_TRUE(l.bos_token_id.has_value());
    EXPECT_EQ(*l.bos_token_id, 128000);
    EXPECT_EQ(l.tie_word_embeddings, m.tie_word_embeddings);
    EXPECT_FALSE(l.attention_bias);
    EXPECT_FALSE(l.mlp_bias);
    EXPECT_EQ(l.hidden_act, "silu");
    EXPECT_EQ(l.torch_dtype, "bfloat16");
  }
}

// ---- bad configs: a minimal valid Llama config, then one thing broken at a time ----

namespace {

nlohmann::json minimal_llama() {
  return {{"vocab_size", 256},      {"hidden_size", 64},        {"intermediate_size", 128},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
}

constexpr const char* kSource = "tiny-config.json";

std::string llama_error(const nlohmann::json& j) {
  return error_of([&] { LlamaConfig::from(ModelConfig::parse(j.dump(), kSource)); });
}

}  // namespace

TEST(Config, MinimalConfigGetsDefaults) {
  LlamaConfig l = LlamaConfig::from(ModelConfig::parse(minimal_llama().dump(), kSource));
  EXPECT_EQ(l.head_dim, 16);
  EXPECT_EQ(l.rope_scaling.rope_type, "default");
  EXPECT_DOUBLE_EQ(l.rope_theta, 10000.0);
  EXPECT_TRUE(l.eos_token_ids.empty());
  EXPECT_FALSE(l.bos_token_id.has_value());

  nlohmann::json j = minimal_llama();
  j.erase("num_key_value_heads");
  j["eos_token_id"] = 2;
  j["rope_scaling"] = nullptr;  // HF writes null for "no scaling"
  l = LlamaConfig::from(ModelConfig::parse(j.dump(), kSource));
  EXPECT_EQ(l.num_key_value_heads, 4);
  EXPECT_EQ(l.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(l.rope_scaling.rope_type, "default");
}

TEST(Config, MissingKeyNamesTheKeyAndTheFile) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    nlohmann::json j = minimal_llama();
    j.erase(key);
    expect_contains(llama_error(j), {kSource, key, "missing"});
  }
}

TEST(Config, WrongTypeNamesTheKey) {
  auto with = [](const char* key, const nlohmann::json& value) {
    nlohmann::json j = minimal_llama();
    j[key] = value;
    return j;
  };
  expect_contains(llama_error(with("hidden_size", "64")), {kSource, "'hidden_size'", "integer"});
  expect_contains(llama_error(with("hidden_size", 64.5)), {kSource, "'hidden_size'", "integer"});
  expect_contains(llama_error(with("rope_theta", "big")), {kSource, "'rope_theta'", "number"});
  expect_contains(llama_error(with("tie_word_embeddings", "yes")), {kSource, "'tie_word_embeddings'", "true or false"});
  expect_contains(llama_error(with("eos_token_id", nlohmann::json::array({1, "2"}))), {kSource, "'eos_token_id'"});
  expect_contains(llama_error(with("torch_dtype", 16)), {kSource, "'torch_dtype'", "string"});
  expect_contains(llama_error(with("num_attention_heads", 0)), {kSource, "'num_attention_heads'", "positive"});
  expect_contains(llama_error(with("hidden_act", "gelu")), {kSource, "'hidden_act'", "gelu"});
  expect_contains(llama_error(with("vocab_size", uint64_t(1) << 63)), {kSource, "'vocab_size'", "out of range"});
  expect_contains(llama_error(with("rms_norm_eps", 0.0)), {kSource, "'rms_norm_eps'", "positive"});
  expect_contains(llama_error(with("rope_theta", -1.0)), {kSource, "'rope_theta'", "positive"});
  expect_contains(llama_error(with("max_position_embeddings", 0)), {kSource, "'max_position_embeddings'", "positive"});
  expect_contains(llama_error(with("head_dim", -4)), {kSource, "head dimension", "positive"});
}

TEST(Config, HeadsMustDivideByKvHeads) {
  nlohmann::json j = minimal_llama();
  j["num_key_value_heads"] = 3;
  expect_contains(llama_error(j), {kSource, "'num_attention_heads' (4)", "'num_key_value_heads' (3)", "multiple"});
  j["num_key_value_heads"] = 0;
  expect_contains(llama_error(j), {kSource, "'num_key_value_heads'"});
}

TEST(Config, HeadDimMustFit) {
  nlohmann::json j = minimal_llama();
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 6;
  expect_contains(llama_error(j), {kSource, "'hidden_size' (64)", "'num_attention_heads' (6)"});
  j["head_dim"] = 7;
  expect_contains(llama_error(j), {kSource, "even", "7"});
}

TEST(Config, DeepSeekYarnMscaleKeys) {
  // DeepSeek-V2-Lite's rope_scaling: with mscale and mscale_all_dim both given, cos and sin are scaled by
  // yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) (transformers' rule): 1 when they are equal.
  const auto parse = [](const std::string& scaling) {
    return parse_rope_config(ModelConfig::parse(R"({"rope_theta": 10000, "rope_scaling": )" + scaling + "}", "t"), 1e4);
  };
  const RopeConfig lite = parse(R"({"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                    "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096})");
  EXPECT_EQ(lite.scaling.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(lite.scaling.attention_factor, 1.0);
  EXPECT_DOUBLE_EQ(lite.scaling.mscale_all_dim, 0.707);
  EXPECT_NEAR(yarn_mscale(40, 0.707), 0.1 * 0.707 * std::log(40.0) + 1, 1e-15);
  EXPECT_NEAR(yarn_mscale(40, 0.707), 1.2608, 1e-4);
  EXPECT_DOUBLE_EQ(yarn_mscale(0.5, 0.707), 1.0);
  const RopeConfig unequal = parse(R"({"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707,
                                       "original_max_position_embeddings": 4096})");
  EXPECT_NEAR(unequal.scaling.attention_factor, yarn_mscale(40, 1.0) / yarn_mscale(40, 0.707), 1e-15);
  // Without both keys the attention factor stays derived from the factor alone (0 here: 0.1 ln(factor) + 1 later).
  EXPECT_DOUBLE_EQ(parse(R"({"type": "yarn", "factor": 40, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 4096})").scaling.attention_factor, 0.0);
  EXPECT_THROW(parse(R"({"type": "yarn", "factor": 40, "mscale": -1, "mscale_all_dim": 1,
                         "original_max_position_embeddings": 4096})"), Error);
}

TEST(Config, RopeScaling) {
  nlohmann::json j = minimal_llama();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  expect_contains(llama_error(j), {kSource, "rope_type", "'longrope'", "not supported"});
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};  // YaRN needs its original context
  expect_contains(llama_error(j), {kSource, "'original_max_position_embeddings'", "missing"});
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096},
                       {"beta_fast", 1.0}, {"beta_slow", 32.0}};
  expect_contains(llama_error(j), {kSource, "beta_slow < beta_fast", "beta_fast 1"});
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.0}};
  expect_contains(llama_error(j), {kSource, "rope_scaling.factor must be positive", "got 0"});

  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // the older spelling of the key
  expect_contains(llama_error(j), {kSource, "'dynamic'", "not supported"});

  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  expect_contains(llama_error(j), {kSource, "rope_scaling", "'factor'", "missing"});

  j["rope_scaling"]["factor"] = 8.0;
  j["rope_scaling"]["high_freq_factor"] = 0.5;
  expect_contains(llama_error(j), {kSource, "high_freq_factor > low_freq_factor"});

  j["rope_scaling"] = "llama3";
  expect_contains(llama_error(j), {kSource, "rope_scaling", "object"});

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(LlamaConfig::from(ModelConfig::parse(j.dump(), kSource)).rope_scaling.rope_type, "default");
}

TEST(Config, InvalidJsonNamesTheFile) {
  expect_contains(error_of([] { ModelConfig::parse("{\"hidden_size\": 64,", kSource); }), {kSource, "not valid JSON"});
  expect_contains(error_of([] { ModelConfig::parse("[1, 2]", kSource); }), {kSource, "object"});
  // Python's non-finite constants (Mamba-2's "time_step_limit": [0.0, Infinity]) are read as Python reads them;
  // inside strings they are text; a misspelt one is still not JSON.
  const ModelConfig py = ModelConfig::parse(
      R"({"time_step_limit": [0.0, Infinity], "lo": -Infinity, "x": NaN, "name": "Infinity \" NaN", "n": 2})", kSource);
  EXPECT_EQ(py.get_double_list("time_step_limit"), (std::vector<double>{0.0, std::numeric_limits<double>::infinity()}));
  EXPECT_EQ(py.get_double("lo"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(py.get_double("x")));
  EXPECT_EQ(py.get_string("name"), "Infinity \" NaN");
  EXPECT_EQ(py.get_int("n"), 2);
  // transformers 5's own spelling of a non-finite float in the config.json it saves.
  EXPECT_EQ(ModelConfig::parse(R"({"t": [0.0, {"__float__": "Infinity"}]})", kSource).get_double_list("t"),
            (std::vector<double>{0.0, std::numeric_limits<double>::infinity()}));
  // dump() writes them back as Python does (nlohmann alone writes null), so a dumped config parses to the same values.
  const ModelConfig again = ModelConfig::parse(py.dump(), kSource);
  EXPECT_EQ(again.get_double_list("time_step_limit"), py.get_double_list("time_step_limit"));
  EXPECT_EQ(again.get_double("lo"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(again.get_double("x")));
  EXPECT_EQ(again.get_string("name"), "Infinity \" NaN");
  expect_contains(error_of([] { ModelConfig::parse(R"({"time_step_floor": Infinit})", kSource); }),
                  {kSource, "not valid JSON"});
  expect_contains(error_of([] { ModelConfig::parse(R"({"a": InfinityX})", kSource); }), {kSource, "not valid JSON"});

  const auto dir = std::filesystem::temp_directory_path() / ("kbn_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "broken-config.json").string();
  std::ofstream(path) << "{\"hidden_size\": 64, oops}";
  expect_contains(error_of([&] { ModelConfig::load(path); }), {path, "not valid JSON"});
  expect_contains(error_of([&] { ModelConfig::load((dir / "absent.json").string()); }), {"absent.json", "cannot open"});
  std::filesystem::remove_all(dir);
}

TEST(Config, TypedAccessors) {
  ModelConfig c = ModelConfig::parse(
      R"({"n": 3, "x": 2.5, "s": "text", "b": true, "list": [1, 2], "nothing": null, "architectures": ["A", 7]})",
      kSource);
  EXPECT_EQ(c.get_int("n"), 3);
  EXPECT_EQ(c.get_int("absent", 9), 9);
  EXPECT_DOUBLE_EQ(c.get_double("x"), 2.5);
  EXPECT_DOUBLE_EQ(c.get_double("n"), 3.0);  // an integer is a number
  EXPECT_EQ(c.get_string("s"), "text");
  EXPECT_TRUE(c.get_bool("b", false));
  EXPECT_EQ(c.get_int_list("list"), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(c.has("nothing"));
  EXPECT_EQ(c.get_int("nothing", 4), 4);
  expect_contains(error_of([&] { c.get_int("x"); }), {kSource, "'x'", "integer"});
  expect_contains(error_of([&] { c.get_string("absent"); }), {kSource, "'absent'", "missing"});
  expect_contains(error_of([&] { c.architectures(); }), {kSource, "'architectures'"});

  ModelConfig empty;  // holds no JSON: reads as a config without keys
  EXPECT_FALSE(empty.has("n"));
  EXPECT_EQ(empty.get_int("n", 5), 5);
  expect_contains(error_of([&] { empty.get_int("n"); }), {"'n'", "missing"});
}

TEST(LlamaConfigRope, TransformersV5RopeParametersMatchV4RopeScaling) {
  // transformers >= 5 writes rope_parameters (with rope_theta inside); older files write rope_scaling.
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1)";
  auto v4 = kbn::LlamaConfig::from(kbn::ModelConfig::parse(
      "{" + base + R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
      "v4"));
  auto v5 = kbn::LlamaConfig::from(kbn::ModelConfig::parse(
      "{" + base + R"(, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
      "v5"));
  for (const auto* c : {&v4, &v5}) {
    EXPECT_EQ(c->rope_theta, 500000.0);
    EXPECT_EQ(c->rope_scaling.rope_type, "llama3");
    EXPECT_EQ(c->rope_scaling.factor, 8.0);
    EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  }
  EXPECT_THROW(kbn::LlamaConfig::from(kbn::ModelConfig::parse(
                   "{" + base + R"(, "rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn"}})", "v5")),
               kbn::Error);
}

// A config without 'architectures' (the published Gemma-3-12B-it's) names its architecture through model_type, as
// transformers' Auto classes map it (each L4 entry declares its model_types); an unknown model_type leaves it empty
// (the loader then says it is missing). resolve_model writes it into the spec's config.
TEST(ModelConfig, ArchitectureFromModelTypeWhenTheListIsMissing) {
  using namespace kbn;
  const Registry& reg = registry(Variant::baseline);
  EXPECT_EQ(reg.architectures_of(ModelConfig::parse(R"({"model_type": "gemma3"})", "t")),
            (std::vector<std::string>{"Gemma3ForConditionalGeneration"}));
  EXPECT_EQ(reg.architectures_of(ModelConfig::parse(R"({"model_type": "gpt_oss"})", "t")),
            (std::vector<std::string>{"GptOssForCausalLM"}));
  EXPECT_EQ(reg.architectures_of(ModelConfig::parse(R"({"architectures": ["X"], "model_type": "gemma3"})", "t")),
            (std::vector<std::string>{"X"}));
  EXPECT_TRUE(reg.architectures_of(ModelConfig::parse(R"({"model_type": "bert"})", "t")).empty());
  EXPECT_TRUE(engine::resolve_model("gemma-3-12b-it").config.architectures() ==
              (std::vector<std::string>{"Gemma3ForConditionalGeneration"}));
}
