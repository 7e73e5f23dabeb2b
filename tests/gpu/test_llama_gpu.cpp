// The whole L4 model on the GPU: tiny Llama in f32 against transformers' logits and greedy tokens, and in
// bf16 against our own f32 run; batched equals one-at-a-time on the GPU too.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/model_loader.h"
#include "test_paths.h"

using namespace kbn;

namespace {

struct HFRun {
  std::vector<std::vector<int64_t>> prompts, greedy;
  std::vector<std::vector<std::vector<double>>> logits;
};

HFRun load_expected(const std::string& name) {
  std::ifstream f(kbn::test::fixture_dir() + "/" + name + "/expected.json");
  auto j = nlohmann::json::parse(f);
  HFRun r;
  for (const auto& p : j["prompts"]) {
    r.prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
    r.greedy.push_back(p["greedy_ids"].get<std::vector<int64_t>>());
    r.logits.push_back(p["prompt_logits"].get<std::vector<std::vector<double>>>());
  }
  return r;
}

double max_abs_diff(const Tensor& ours, const std::vector<std::vector<double>>& ref) {
  auto v = ours.to_floats();
  const size_t vocab = size_t(ours.size(1));
  double m = 0;
  for (size_t t = 0; t < ref.size(); ++t)
    for (size_t i = 0; i < vocab; ++i) m = std::max(m, std::fabs(double(v[t * vocab + i]) - ref[t][i]));
  return m;
}

}  // namespace

TEST(LlamaGpu, TinyF32MatchesTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  for (const char* name : {"tiny-llama", "tiny-llama-tied"}) {
    HFRun hf = load_expected(name);
    auto spec = engine::resolve_model(kbn::test::fixture_dir() + "/" + name);
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
    engine::GenerateOptions opt;
    opt.max_new_tokens = int64_t(hf.greedy[0].size());
    opt.return_prompt_logits = true;
    auto res = engine::generate_tokens(*model, hf.prompts, Device::cuda(0), Variant::baseline, opt);
    for (size_t i = 0; i < hf.prompts.size(); ++i) {
      // f32 GEMMs without TF32 and fp32 attention: ~1e-6 on logits of magnitude < 1.
      EXPECT_LT(max_abs_diff(res.prompt_logits[i], hf.logits[i]), 5e-5) << name << " prompt " << i;
      EXPECT_EQ(res.tokens[i], hf.greedy[i]) << name << " prompt " << i;
    }
  }
}

TEST(LlamaGpu, TinyBf16CloseToF32) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  HFRun hf = load_expected("tiny-llama");
  auto spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  auto model = engine::build_model(spec, Variant::baseline, {DType::bf16, Device::cuda(0)}, 0);
  engine::GenerateOptions opt;
  opt.max_new_tokens = 1;
  opt.return_prompt_logits = true;
  auto res = engine::generate_tokens(*model, hf.prompts, Device::cuda(0), Variant::baseline, opt);
  for (size_t i = 0; i < hf.prompts.size(); ++i) {
    // bf16 weights and activations (8 mantissa bits) on logits of magnitude < 1: a few 1e-3.
    EXPECT_LT(max_abs_diff(res.prompt_logits[i], hf.logits[i]), 2.5e-2) << "prompt " << i;
  }
}

TEST(LlamaGpu, BatchedEqualsOneAtATime) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto spec = engine::resolve_model("llama-3.2-1b-instruct");
  // f32: different batch sizes pick different GEMM algorithms, and bf16 rounding could then flip a near-tie
  // of random weights; in f32 the order-of-summation differences (~1e-6) stay far below the logit margins.
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cuda(0)}, 7);
  std::vector<std::vector<int64_t>> prompts = {
      {128000, 791, 6864, 315}, {128000, 40, 1093, 311, 1456, 1618, 30}, {9906}};
  engine::GenerateOptions opt;
  opt.max_new_tokens = 12;
  auto batched = engine::generate_tokens(*model, prompts, Device::cuda(0), Variant::baseline, opt);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto single = engine::generate_tokens(*model, {prompts[i]}, Device::cuda(0), Variant::baseline, opt);
    EXPECT_EQ(batched.tokens[i], single.tokens[0]) << "prompt " << i;
  }
}
