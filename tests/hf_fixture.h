#pragma once
// An L4 model against Hugging Face transformers (external truth): fixtures made by tools/hf_reference.py on the
// H200 with seeded random fp32 weights, loaded through kb-nano's own safetensors loader and run on CPU, where every
// L1 op is the reference oracle. Shared by the per-family tests (test_llama_hf.cpp, test_qwen3_hf.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "kbn/error.h"
#include "test_paths.h"

namespace kbn::test {

struct HfFixture {
  engine::ModelSpec spec;
  nlohmann::json expected;
};

inline HfFixture load_hf_fixture(const std::string& name) {
  std::string dir = fixture_dir() + "/" + name;
  std::ifstream f(dir + "/expected.json");
  EXPECT_TRUE(f.good()) << dir;
  return {engine::resolve_model(dir), nlohmann::json::parse(f)};
}

// Logits of transformers (fp32 on the GPU, TF32 off) and ours (double accumulation) agree to ~1e-7 on logits
// of magnitude <= 0.7 (measured); 2e-5 leaves room for accumulation order and still fails on real mistakes:
// dropping the llama3 rope scaling moves these logits by 2e-4..1e-3, a transposed weight by far more.
constexpr double kLogitTolerance = 2e-5;

// `model` (CPU, f32, loaded with the fixture's weights) on the fixture's prompts: every prompt logit within
// kLogitTolerance of transformers', every greedy token equal. `name` labels the failures.
inline void check_model_against_hf(CausalLM& model, const HfFixture& fx, const std::string& name) {
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : fx.expected["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
  engine::GenerateOptions opt;
  opt.max_new_tokens = int64_t(fx.expected["prompts"][0]["greedy_ids"].size());
  opt.return_prompt_logits = true;
  auto res = engine::generate_tokens(model, prompts, Device::cpu(), Variant::baseline, opt);

  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = fx.expected["prompts"][i];
    auto hf_logits = p["prompt_logits"].get<std::vector<std::vector<double>>>();
    std::vector<float> ours = res.prompt_logits[i].to_floats();
    const int64_t vocab = res.prompt_logits[i].size(1);
    double max_err = 0;
    for (size_t t = 0; t < hf_logits.size(); ++t)
      for (int64_t v = 0; v < vocab; ++v)
        max_err = std::max(max_err, std::fabs(double(ours[t * size_t(vocab) + size_t(v)]) - hf_logits[t][size_t(v)]));
    EXPECT_LT(max_err, kLogitTolerance) << name << " prompt " << i;
    EXPECT_EQ(res.tokens[i], p["greedy_ids"].get<std::vector<int64_t>>()) << name << " prompt " << i;
  }
}

// The fixture's own model through kb-nano's loader, against transformers.
inline void check_against_hf(const std::string& name) {
  const HfFixture fx = load_hf_fixture(name);
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  check_model_against_hf(*model, fx, name);
}

// Every fixture prompt `repeats` times through the continuous-batching engine under `cfg` (CPU, fp32): each request
// must give transformers' greedy tokens. Returns the run (preemptions, ...) for the caller's own checks.
inline engine::RunResult check_engine_greedy(const HfFixture& fx, const engine::EngineConfig& cfg, int repeats) {
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::LLMEngine eng(*model, Variant::baseline, Device::cpu(), cfg);
  std::vector<engine::Request> rs;
  for (int rep = 0; rep < repeats; ++rep)
    for (const auto& p : fx.expected["prompts"]) {
      engine::Request r;
      r.id = int64_t(rs.size());
      r.prompt = p["prompt_ids"].get<std::vector<int64_t>>();
      r.sampling.max_tokens = int64_t(p["greedy_ids"].size());
      rs.push_back(r);
    }
  engine::RunResult res = eng.run_to_completion(rs);
  EXPECT_EQ(res.outputs.size(), rs.size());
  const size_t n = fx.expected["prompts"].size();
  for (size_t i = 0; i < rs.size() && i < res.outputs.size(); ++i)
    EXPECT_EQ(res.outputs[i].tokens, fx.expected["prompts"][i % n]["greedy_ids"].get<std::vector<int64_t>>())
        << "request " << i << " (budget " << cfg.max_num_batched_tokens << ")";
  eng.scheduler().check_invariants();
  return res;
}

// The error building the fixture's model with `overrides` (JSON) written over its config; a model that builds is a
// test failure (and gives "").
inline std::string build_error_with(const HfFixture& fx, const std::string& overrides) {
  engine::ModelSpec spec = fx.spec;
  spec.config = fx.spec.config.with_overrides(overrides, "the fixture with " + overrides);
  try {
    engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << overrides << " was accepted";
  return {};
}

}  // namespace kbn::test
