// --kv-cache-dtype fp8_e4m3 (vLLM's kv_cache_dtype): the paged K/V stored as fp8 e4m3 (scale 1.0) and read back by
// the attention ops. What the option accepts and refuses, what the store writes (rounded to nearest even, saturated
// at +-448), the cache it allocates (a quarter of an f32 page, half of a 16-bit one), and its accuracy cost end to end:
// the transformers fixtures' prompt logits and greedy tokens with fp8 pages against the same model with full-precision
// pages (which match transformers to 2e-5), through batched generation and through the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "L1/store_kvcache.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "hf_fixture.h"
#include "kbn/cache_spec.h"
#include "kbn/error.h"

namespace {

using namespace kbn;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KvCacheDtype, TheOptionTakesVllmsNamesAndNamesWhatItRefuses) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), DType::fp8e4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), DType::fp8e4m3);
  const std::string e5m2 = error_of([] { parse_kv_cache_dtype("fp8_e5m2", "--kv-cache-dtype"); });
  EXPECT_NE(e5m2.find("--kv-cache-dtype: expected auto, fp8 or fp8_e4m3, got 'fp8_e5m2' (no kernel reads e5m2"),
            std::string::npos)
      << e5m2;
  EXPECT_NE(error_of([] { parse_kv_cache_dtype("bf16"); }).find("kv_cache_dtype: expected auto"), std::string::npos);

  // The paged K/V layers change dtype; states do not; a latent cache (MLA) has no fp8 path and is named.
  LayerCacheSpec state;
  state.kind = LayerCacheSpec::Kind::state;
  state.dtype = DType::f32;
  state.state_shapes = {{3, 8}};
  const auto specs = with_kv_cache_dtype({LayerCacheSpec::paged_kv(2, 16, DType::bf16, 8), state}, DType::fp8e4m3);
  EXPECT_EQ(specs[0].dtype, DType::fp8e4m3);
  EXPECT_EQ(specs[0].sliding_window, 8);
  EXPECT_EQ(specs[0].bytes_per_token(), 2 * 2 * 16);
  EXPECT_EQ(specs[1].dtype, DType::f32);
  const std::string latent =
      error_of([] { with_kv_cache_dtype({LayerCacheSpec::paged_latent(576, DType::bf16)}, DType::fp8e4m3); });
  EXPECT_NE(latent.find("layer 0 keeps a paged latent 576 bf16 cache, which has no fp8e4m3 path"), std::string::npos)
      << latent;
  // The engine refuses a bad value before it builds anything.
  const engine::ModelSpec spec = engine::resolve_model(test::fixture_dir() + "/tiny-llama");
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::EngineConfig cfg;
  cfg.max_model_len = 64;
  cfg.kv_cache_dtype = "int8";
  const std::string bad = error_of([&] { engine::LLMEngine(*model, Variant::baseline, Device::cpu(), cfg); });
  EXPECT_NE(bad.find("engine: kv_cache_dtype: expected auto, fp8 or fp8_e4m3, got 'int8'"), std::string::npos) << bad;
}

// The store rounds each element once to the nearest fp8 e4m3 value (ties to even) and saturates at +-448; the
// attention ops then read those values as they are.
TEST(KvCacheDtype, TheStoreRoundsToFp8AndSaturates) {
  const std::vector<float> k = {1.0f, 1.0625f, 1.1875f, -3.3f, 447.0f, 1000.0f, -1e6f, 0.0009f};
  const std::vector<float> v = {0.5f, -0.5f, 2.0f, 240.0f, 17.0f, -17.0f, 3.0f, -0.0f};
  const Tensor key = Tensor::from_floats(k, {1, 2, 4}, DType::bf16),
               value = Tensor::from_floats(v, {1, 2, 4}, DType::bf16);
  Tensor kc = Tensor::zeros({2, 2, 2, 4}, DType::fp8e4m3, Device::cpu());
  Tensor vc = Tensor::zeros({2, 2, 2, 4}, DType::fp8e4m3, Device::cpu());
  baseline::StoreKVCache().forward(key, value, kc, vc, Tensor::from_i64({3}, {1}));
  const std::vector<float> got_k = kc.select(0, 1).select(0, 1).contiguous().to_floats();
  const std::vector<float> got_v = vc.select(0, 1).select(0, 1).contiguous().to_floats();
  const std::vector<float> key_bf16 = key.to_floats(), value_bf16 = value.to_floats();
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(got_k[i], fp8e4m3_to_float(float_to_fp8e4m3(key_bf16[i]))) << "key element " << i;
    EXPECT_EQ(got_v[i], fp8e4m3_to_float(float_to_fp8e4m3(value_bf16[i]))) << "value element " << i;
  }
  EXPECT_EQ(got_k[1], 1.0f);    // 1.0625 is halfway between 1 and 1.125: to even
  EXPECT_EQ(got_k[2], 1.25f);   // 1.1875 is halfway between 1.125 and 1.25: to even
  EXPECT_EQ(got_k[5], 448.0f);  // saturated, not NaN
  EXPECT_EQ(got_k[6], -448.0f);
  EXPECT_EQ(kc.select(0, 0).to_floats(), std::vector<float>(16, 0.0f));  // other slots untouched
  // A cache of another dtype than the keys' that is not fp8 is refused, naming both.
  Tensor f16 = Tensor::zeros({2, 2, 2, 4}, DType::f16, Device::cpu());
  const std::string e =
      error_of([&] { baseline::StoreKVCache().forward(key, value, f16, f16, Tensor::from_i64({0}, {1})); });
  EXPECT_NE(e.find("key_cache"), std::string::npos) << e;
}

struct Accuracy {
  double max_logit_err = 0;             // over every prompt position, against full-precision pages
  double max_logit = 0;                 // the largest |logit| seen (the scale of the error)
  int64_t tokens = 0, equal = 0;        // transformers' greedy tokens, and how many fp8 pages give before a divergence
  int64_t positions = 0, same_top = 0;  // prompt positions, and those whose argmax fp8 pages keep (same context)
};

// The fixture's prompts with fp8 pages: prompt logits against the same model with f32 pages, greedy tokens against
// transformers'. The engine, with chunked prefill and prefix caching, must give generate_tokens' fp8 tokens.
Accuracy fp8_accuracy(const std::string& name) {
  const test::HfFixture fx = test::load_hf_fixture(name);
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : fx.expected["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
  engine::GenerateOptions opt;
  opt.max_new_tokens = int64_t(fx.expected["prompts"][0]["greedy_ids"].size());
  opt.return_prompt_logits = true;
  opt.block_size = 4;
  const engine::GenerateResult full = engine::generate_tokens(*model, prompts, Device::cpu(), Variant::baseline, opt);
  opt.kv_cache_dtype = "fp8_e4m3";
  const engine::GenerateResult fp8 = engine::generate_tokens(*model, prompts, Device::cpu(), Variant::baseline, opt);
  Accuracy a;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float> x = full.prompt_logits[i].to_floats(), y = fp8.prompt_logits[i].to_floats();
    for (size_t j = 0; j < x.size(); ++j) {
      a.max_logit_err = std::max(a.max_logit_err, std::fabs(double(x[j]) - double(y[j])));
      a.max_logit = std::max(a.max_logit, std::fabs(double(x[j])));
    }
    const size_t V = size_t(full.prompt_logits[i].size(1));
    for (size_t t = 0; t * V < x.size(); ++t, ++a.positions)
      a.same_top += std::max_element(x.begin() + long(t * V), x.begin() + long((t + 1) * V)) - x.begin() ==
                    std::max_element(y.begin() + long(t * V), y.begin() + long((t + 1) * V)) - y.begin();
    const auto hf = fx.expected["prompts"][i]["greedy_ids"].get<std::vector<int64_t>>();
    a.tokens += int64_t(hf.size());
    // After a divergence the contexts differ: count the common prefix.
    for (size_t t = 0; t < hf.size() && t < fp8.tokens[i].size() && fp8.tokens[i][t] == hf[t]; ++t) ++a.equal;
  }

  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;
  cfg.num_kv_blocks = 512;
  cfg.kv_cache_dtype = "fp8";
  engine::LLMEngine eng(*model, Variant::baseline, Device::cpu(), cfg);
  EXPECT_EQ(eng.runner().cache_specs()[0].dtype, DType::fp8e4m3) << name;
  std::vector<engine::Request> rs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request r;
    r.id = int64_t(i);
    r.prompt = prompts[i];
    r.sampling.max_tokens = opt.max_new_tokens;
    rs.push_back(r);
  }
  const engine::RunResult run = eng.run_to_completion(rs);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(run.outputs[i].tokens, fp8.tokens[i]) << name << ": the engine's fp8 tokens, prompt " << i;
  std::printf(
      "%s with fp8 e4m3 KV: max |logit error| %.4g (largest |logit| %.3g), argmax kept at %lld of %lld "
      "prompt positions, %lld of %lld greedy tokens before the first divergence from transformers\n",
      name.c_str(), a.max_logit_err, a.max_logit, (long long)a.same_top, (long long)a.positions, (long long)a.equal,
      (long long)a.tokens);
  return a;
}

// The accuracy cost, measured on every attention family's fixture. fp8 e4m3 keeps 3 mantissa bits (a relative
// error up to 2^-4 per element): at the first position (attention = the value row) the logits move by ~5% of their
// scale, and further on the score errors pass through the softmax. Measured (random tiny weights, block size 4;
// max |logit error| of the largest |logit|, prompt positions whose argmax stays, greedy tokens before the first
// divergence from transformers): tiny-llama 0.017 of 0.66, 39/40, 39/64; tiny-qwen3 0.23 of 2.8, 38/40, 64/64;
// tiny-gemma3 2.8 of 5.7, 30/40, 19/64 (q/k norms make its scores up to ~6.5, so a key's rounding moves a score by
// tenths); tiny-gpt-oss 0.47 of 2.6, 38/40, 43/64; tiny-mixtral 0.14 of 2.7, 37/40, 24/64. These tiny random models
// have near-tied logits, so greedy runs diverge early; the bounds catch a misread page (garbage or NaN logits, the
// argmax lost at most positions), not the rounding.
TEST(KvCacheDtype, Fp8PagesCostThisMuchAccuracyOnTheTransformersFixtures) {
  for (const char* name : {"tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-gpt-oss", "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    const Accuracy a = fp8_accuracy(name);
    EXPECT_GT(a.max_logit_err, 0.0) << "the fp8 pages were not used";
    EXPECT_LT(a.max_logit_err, 0.6 * a.max_logit);
    EXPECT_GE(4 * a.same_top, 3 * a.positions);
  }
}

// The engine sizes the cache in fp8 pages: a block of an f32 model costs a quarter, so four times the blocks fit.
TEST(KvCacheDtype, TheEngineAllocatesFp8Pages) {
  const engine::ModelSpec spec = engine::resolve_model(test::fixture_dir() + "/tiny-llama");
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::ModelRunner f32(*model, Variant::baseline, Device::cpu(), 16);
  engine::ModelRunner fp8(*model, Variant::baseline, Device::cpu(), 16, engine::ExecutionMode::eager, DType::fp8e4m3);
  EXPECT_EQ(fp8.kv_bytes_per_block() * 4, f32.kv_bytes_per_block());
  EXPECT_EQ(fp8.kv_bytes_per_token() * 4, f32.kv_bytes_per_token());
  const auto a = f32.auto_num_kv_blocks(64, 4, 2048, 0.9), b = fp8.auto_num_kv_blocks(64, 4, 2048, 0.9);
  EXPECT_GE(b.num_blocks, a.num_blocks);
}

}  // namespace
