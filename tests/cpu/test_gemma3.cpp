// Gemma-3 (Gemma3ForCausalLM) on CPU: the config's layer types and ropes (the published 12B config, the tiny test
// config, transformers 5's rope_parameters), the model's internal consistency with windows shorter than the
// prompts (prefill = token-by-token decode = chunked prefill), the window actually applied, the embedding scale, the
// per-layer cache specs and the checkpoint names. Parity with transformers' Gemma3ForCausalLM needs a fixture
// generated on the GPU machine (tools/hf_reference.py --config models/tiny-gemma3.json); none is committed yet.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "L1/embedding.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "configs/gemma3.h"
#include "kbn/error.h"
#include "kbn/module.h"

using namespace kbn;

namespace {

ModelConfig tiny_config() { return engine::resolve_model("tiny-gemma3").config; }

ModelConfig edited(const ModelConfig& c, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(c.dump());
  edit(j);
  return ModelConfig::parse(j.dump(), "edited tiny-gemma3");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::unique_ptr<CausalLM> build(const ModelConfig& config, uint64_t seed = 7) {
  engine::ModelSpec spec = engine::resolve_model("tiny-gemma3");
  spec.config = config;
  return engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, seed);
}

std::vector<int64_t> prompt(int64_t n) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back((i * 37 + 11) % 512);
  return p;
}

}  // namespace

TEST(Gemma3Config, LayerTypesRopesAndTheNestedTextConfig) {
  const Gemma3TextConfig t = Gemma3TextConfig::from(tiny_config());
  EXPECT_EQ(t.sliding, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(t.sliding_window, 8);
  EXPECT_EQ(t.query_pre_attn_scalar, 24);
  EXPECT_EQ(t.rope_local.theta, 10000.0);
  EXPECT_EQ(t.rope_local.scaling.rope_type, "default");
  EXPECT_EQ(t.rope_global.theta, 1e6);
  EXPECT_EQ(t.rope_global.scaling.rope_type, "linear");
  EXPECT_EQ(t.rope_global.scaling.factor, 4.0);
  // The published Gemma-3-12B config nests the text model; no layer_types: every sixth layer is full.
  const Gemma3TextConfig g = Gemma3TextConfig::from(engine::resolve_model("gemma-3-12b-it").config);
  ASSERT_EQ(g.sliding.size(), 48u);
  for (size_t i = 0; i < 48; ++i) EXPECT_EQ(g.sliding[i], (i + 1) % 6 != 0) << "layer " << i;
  EXPECT_EQ(g.head_dim, 256);
  EXPECT_EQ(g.sliding_window, 1024);
  EXPECT_EQ(g.rope_global.scaling.factor, 8.0);
  EXPECT_EQ(g.vocab_size, 262208);
  // transformers 5 writes one rope per layer type.
  const Gemma3TextConfig r = Gemma3TextConfig::from(edited(tiny_config(), [](nlohmann::json& j) {
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j.erase("rope_local_base_freq");
    j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 5e5}}},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  }));
  EXPECT_EQ(r.rope_global.theta, 5e5);
  EXPECT_EQ(r.rope_global.scaling.factor, 8.0);
  EXPECT_EQ(r.rope_local.theta, 1e4);
  EXPECT_EQ(r.rope_local.scaling.rope_type, "default");
}

TEST(Gemma3Config, BadKeysAreNamed) {
  const ModelConfig c = tiny_config();
  EXPECT_NE(error_of([&] {
              Gemma3TextConfig::from(edited(c, [](nlohmann::json& j) { j["layer_types"] = {"sliding_attention"}; }));
            }).find("'layer_types' lists 1 layers but 'num_hidden_layers' is 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Gemma3TextConfig::from(edited(c, [](nlohmann::json& j) { j["layer_types"][2] = "chunked_attention"; }));
            }).find("'layer_types'[2] is \"chunked_attention\""),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Gemma3TextConfig::from(edited(c, [](nlohmann::json& j) { j["hidden_activation"] = "silu"; }));
            }).find("'hidden_activation' must be \"gelu_pytorch_tanh\""),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Gemma3TextConfig::from(edited(c, [](nlohmann::json& j) { j["final_logit_softcapping"] = 30.0; }));
            }).find("'final_logit_softcapping'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Gemma3TextConfig::from(edited(c, [](nlohmann::json& j) { j["sliding_window"] = 0; }));
            }).find("'sliding_window' must be positive"),
            std::string::npos);
}

// The embedding normaliser: rounded to the weight dtype first (sqrt(3840) = 61.97 is 62 in bf16), each product too.
TEST(Gemma3Model, EmbeddingScaleRoundsLikeTheDtype) {
  baseline::Embedding e;
  const Tensor w = Tensor::from_floats({1.f, -2.f, 0.5f, 3.f}, {2, 2}, DType::bf16);
  const Tensor ids = Tensor::from_i64({1, 0}, {2});
  EXPECT_EQ(e.forward(ids, w, 0, 2, std::sqrt(3840.0)).to_floats(), (std::vector<float>{31.f, 186.f, 62.f, -124.f}));
  const Tensor wf = Tensor::from_floats({1.f, -2.f, 0.5f, 3.f}, {2, 2}, DType::f32);
  const float s = float(std::sqrt(3840.0));
  EXPECT_EQ(e.forward(ids, wf, 0, 2, std::sqrt(3840.0)).to_floats(),
            (std::vector<float>{0.5f * s, 3.f * s, 1.f * s, -2.f * s}));
  EXPECT_THROW(e.forward(ids, w, 0, 2, std::nan("")), Error);
}

TEST(Gemma3Model, CacheSpecsCarryTheSlidingLayersWindow) {
  const auto model = build(tiny_config());
  const auto specs = model->cache_specs();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].sliding_window, 8);
  EXPECT_EQ(specs[1].sliding_window, 8);
  EXPECT_EQ(specs[2].sliding_window, 0);
  EXPECT_EQ(specs[2].describe(), "paged K/V 2 x 32 f32");
}

// With a 20-token prompt and 8-token windows, the logits of every prompt position from one prefill equal those of
// each prefix's last position (its own prefill), the engine's chunked prefill gives the same greedy tokens, and a
// window wide enough to cover the prompt changes the logits (the window is applied) only past 8 tokens.
TEST(Gemma3Model, WindowedPrefillEqualsPrefixesAndChunks) {
  auto model = build(tiny_config());
  const std::vector<int64_t> p = prompt(20);
  engine::GenerateOptions g;
  g.max_new_tokens = 1;
  g.return_prompt_logits = true;
  const Tensor all = engine::generate_tokens(*model, {p}, Device::cpu(), Variant::baseline, g).prompt_logits.at(0);
  const std::vector<float> all_v = all.to_floats();
  const int64_t V = all.size(1);
  engine::GenerateOptions last;
  last.max_new_tokens = 1;
  last.return_last_logits = true;
  for (int64_t n : {1, 7, 8, 9, 15, 20}) {
    const std::vector<int64_t> prefix(p.begin(), p.begin() + n);
    const std::vector<float> l =
        engine::generate_tokens(*model, {prefix}, Device::cpu(), Variant::baseline, last).last_logits.to_floats();
    double max_diff = 0;
    for (int64_t v = 0; v < V; ++v) max_diff = std::max(max_diff, double(std::fabs(l[size_t(v)] - all_v[size_t((n - 1) * V + v)])));
    EXPECT_LT(max_diff, 1e-4) << "prefix " << n;
  }
  // Chunked prefill and decode steps in the engine: the same greedy tokens as one prefill.
  engine::Request r;
  r.id = 0;
  r.prompt = p;
  r.sampling.max_tokens = 12;
  r.sampling.ignore_eos = true;
  engine::EngineConfig cfg;
  cfg.max_model_len = 64;
  cfg.num_kv_blocks = 48;  // blocks of one layer's page: three KV cache groups (windows 0, 8, 8) of one layer
  cfg.block_size = 4;
  engine::LLMEngine whole(*model, Variant::baseline, Device::cpu(), cfg);
  const auto a = whole.run_to_completion({r}).outputs.at(0).tokens;
  cfg.max_num_batched_tokens = 3;
  engine::LLMEngine chunked(*model, Variant::baseline, Device::cpu(), cfg);
  EXPECT_EQ(chunked.run_to_completion({r}).outputs.at(0).tokens, a);
  engine::GenerateOptions twelve;
  twelve.max_new_tokens = 12;
  EXPECT_EQ(engine::generate_tokens(*model, {p}, Device::cpu(), Variant::baseline, twelve).tokens.at(0), a);

  // The same weights with a 64-token window: equal logits while the prompt fits in 8 tokens, different after.
  auto wide = build(edited(tiny_config(), [](nlohmann::json& j) { j["sliding_window"] = 64; }));
  const std::vector<float> wide_v =
      engine::generate_tokens(*wide, {p}, Device::cpu(), Variant::baseline, g).prompt_logits.at(0).to_floats();
  double early = 0, late = 0;
  for (int64_t v = 0; v < 8 * V; ++v) early = std::max(early, double(std::fabs(wide_v[size_t(v)] - all_v[size_t(v)])));
  for (int64_t v = 8 * V; v < 20 * V; ++v) late = std::max(late, double(std::fabs(wide_v[size_t(v)] - all_v[size_t(v)])));
  EXPECT_LT(early, 1e-5);
  EXPECT_GT(late, 1e-3);
}

// A checkpoint in HF's names (q/k/v and gate/up separate, four layer norms, q/k norms, tied head) loads into a fresh
// model and reproduces the original's logits.
TEST(Gemma3Model, LoadsHuggingFaceNames) {
  auto original = build(tiny_config());
  const Gemma3TextConfig c = Gemma3TextConfig::from(tiny_config());
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::map<std::string, Tensor> hf;
  for (const auto& [name, p] : original->named_parameters()) {
    const Tensor& t = *p.tensor;
    auto put = [&](const std::string& n, const Tensor& v) { hf[n] = v.contiguous(); };
    if (auto at = name.find(".qkv_proj."); at != std::string::npos) {
      const std::string base = name.substr(0, at);
      put(base + ".q_proj.weight", t.slice(0, 0, q));
      put(base + ".k_proj.weight", t.slice(0, q, q + kv));
      put(base + ".v_proj.weight", t.slice(0, q + kv, q + 2 * kv));
    } else if (auto at2 = name.find(".gate_up_proj."); at2 != std::string::npos) {
      const std::string base = name.substr(0, at2);
      put(base + ".gate_proj.weight", t.slice(0, 0, c.intermediate_size));
      put(base + ".up_proj.weight", t.slice(0, c.intermediate_size, 2 * c.intermediate_size));
    } else {
      put(name, t);
    }
  }
  EXPECT_TRUE(hf.count("model.layers.2.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(hf.count("model.layers.0.self_attn.q_norm.weight"));
  auto fresh = build(tiny_config(), 8);  // other random weights, all overwritten by the load
  fresh->load_weights([&](const WeightVisitor& visit) {
    for (const auto& [n, t] : hf) visit(n, t);
  });
  engine::GenerateOptions g;
  g.max_new_tokens = 1;
  g.return_last_logits = true;
  const std::vector<int64_t> p = prompt(12);
  EXPECT_EQ(engine::generate_tokens(*fresh, {p}, Device::cpu(), Variant::baseline, g).last_logits.to_floats(),
            engine::generate_tokens(*original, {p}, Device::cpu(), Variant::baseline, g).last_logits.to_floats());
}
