// --kv-cache-dtype fp8_e4m3 (vLLM's kv_cache_dtype): the paged K/V stored as fp8 e4m3 (with the checkpoint's
// per-tensor k_scale / v_scale, else 1.0) and read back by the attention ops. What the option accepts and refuses, what the store writes (rounded to nearest even, saturated
// at +-448), the cache it allocates (a quarter of an f32 page, half of a 16-bit one), and its accuracy cost end to end:
// the transformers fixtures' prompt logits and greedy tokens with fp8 pages against the same model with full-precision
// pages (which match transformers to 2e-5), through batched generation and through the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "L1/store_kvcache.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "hf_fixture.h"
#include "test_process.h"
#include "kbn/cache_spec.h"
#include "kbn/error.h"
#include "kbn/safetensors.h"
#include "kbn/weight_loading.h"

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

// The prompts' greedy tokens through the engine with fp8 pages, chunked prefill (5-token steps) and 4-token blocks.
std::vector<std::vector<int64_t>> engine_fp8_tokens(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                                    int64_t max_tokens) {
  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;
  cfg.num_kv_blocks = 512;
  cfg.kv_cache_dtype = "fp8";
  engine::LLMEngine eng(model, Variant::baseline, Device::cpu(), cfg);
  EXPECT_EQ(eng.runner().cache_specs()[0].dtype, DType::fp8e4m3);
  std::vector<engine::Request> rs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request r;
    r.id = int64_t(i);
    r.prompt = prompts[i];
    r.sampling.max_tokens = max_tokens;
    rs.push_back(r);
  }
  const engine::RunResult run = eng.run_to_completion(rs);
  std::vector<std::vector<int64_t>> out;
  for (const auto& o : run.outputs) out.push_back(o.tokens);
  return out;
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

  const auto engine_tokens = engine_fp8_tokens(*model, prompts, opt.max_new_tokens);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(engine_tokens[i], fp8.tokens[i]) << name << ": the engine's fp8 tokens, prompt " << i;
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

// ---- per-tensor scales (vLLM's k_scale / v_scale, from checkpoints calibrated for an fp8 KV cache) ----

// The store writes float(x) / scale rounded once: a key of 960 with k_scale 4 keeps its value (240 in the page)
// where scale 1.0 saturates it at 448; a value of 0.0009 with v_scale 1/256 leaves the subnormal range.
TEST(KvCacheScales, TheStoreDividesByTheScales) {
  const std::vector<float> k = {960.0f, -1500.0f, 3.3f, 0.5f}, v = {0.0009f, -0.0021f, 0.1f, 0.0f};
  const Tensor key = Tensor::from_floats(k, {1, 1, 4}, DType::f32), value = Tensor::from_floats(v, {1, 1, 4}, DType::f32);
  Tensor kc = Tensor::zeros({1, 2, 1, 4}, DType::fp8e4m3, Device::cpu());
  Tensor vc = Tensor::zeros({1, 2, 1, 4}, DType::fp8e4m3, Device::cpu());
  const KVScales scales{4.0f, 1.0f / 256};
  baseline::StoreKVCache().forward(key, value, kc, vc, Tensor::from_i64({1}, {1}), scales);
  const std::vector<float> got_k = kc.select(0, 0).select(0, 1).contiguous().to_floats();
  const std::vector<float> got_v = vc.select(0, 0).select(0, 1).contiguous().to_floats();
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(got_k[i], fp8e4m3_to_float(float_to_fp8e4m3(k[i] / scales.k))) << "key element " << i;
    EXPECT_EQ(got_v[i], fp8e4m3_to_float(float_to_fp8e4m3(v[i] / scales.v))) << "value element " << i;
  }
  EXPECT_EQ(got_k[0] * scales.k, 960.0f);   // 240 is an e4m3 value: stored exactly
  EXPECT_EQ(got_k[1], -384.0f);             // -375 rounds to -384 (step 32 above 256), not saturated
  EXPECT_NEAR(got_v[0] * scales.v, 0.0009, 0.0009 / 16);  // 0.2304 in the page: a normal e4m3 value, 3 mantissa bits

  // Scales must be finite and positive, and 16-bit pages take only 1.0 (they hold the values as they are).
  const std::string zero = error_of([&] {
    baseline::StoreKVCache().forward(key, value, kc, vc, Tensor::from_i64({0}, {1}), {0.0f, 1.0f});
  });
  EXPECT_NE(zero.find("store_kvcache: argument 'k_scale' must be a finite positive per-tensor scale, got 0"),
            std::string::npos)
      << zero;
  const std::string nan = error_of([&] {
    baseline::StoreKVCache().forward(key, value, kc, vc, Tensor::from_i64({0}, {1}), {1.0f, std::nanf("")});
  });
  EXPECT_NE(nan.find("argument 'v_scale' must be a finite positive"), std::string::npos) << nan;
  Tensor f32 = Tensor::zeros({1, 2, 1, 4}, DType::f32, Device::cpu());
  const std::string sixteen = error_of([&] {
    baseline::StoreKVCache().forward(key, value, f32, f32, Tensor::from_i64({0}, {1}), {2.0f, 1.0f});
  });
  EXPECT_NE(sixteen.find("argument 'k_scale' is 2, but the pages are f32: only fp8 e4m3 pages"), std::string::npos)
      << sixteen;
}

// Attention over scaled fp8 pages reads each key as e * k_scale and each value as e * v_scale: exactly the op over
// f32 pages holding those products (exact in f32: 4 significant bits times scales of 2 and 3 bits). Then the accuracy
// calibrated scales buy: keys up to 900 (past e4m3's 448) and values under 0.01 (e4m3's subnormals below 2^-6) stored
// through the op, attention against the f32 pages' attention.
TEST(KvCacheScales, AttentionReadsScaledPagesAsTheirValues) {
  const int64_t heads = 4, kv_heads = 2, D = 16, bs = 4, blocks = 6;
  const double sm = 1.0 / std::sqrt(double(D));
  std::vector<float> kf(size_t(blocks * bs * kv_heads * D)), vf(kf.size()), qf(size_t(3 * heads * D));
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23);  // uniform in [-1, 1)
  };
  for (float& x : kf) x = 900.0f * next();
  for (float& x : vf) x = 0.01f * next();
  for (float& x : qf) x = 0.007f * next();  // scores of std ~2
  const Tensor k = Tensor::from_floats(kf, {blocks * bs, kv_heads, D}), v = Tensor::from_floats(vf, {blocks * bs, kv_heads, D});
  std::vector<int64_t> slots(size_t(blocks * bs));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t((i * 7) % slots.size());  // pages out of order
  const Tensor slot_mapping = Tensor::from_i64(slots, {blocks * bs});
  const Shape page{blocks, bs, kv_heads, D};
  auto store = [&](DType dt, KVScales sc) {
    std::pair<Tensor, Tensor> c{Tensor::zeros(page, dt, Device::cpu()), Tensor::zeros(page, dt, Device::cpu())};
    baseline::StoreKVCache().forward(k, v, c.first, c.second, slot_mapping, sc);
    return c;
  };
  // Sequences of 24 and 10 keys (block tables over the same shuffled pages), prefill rows 3 and decode rows.
  const Tensor q_dec = Tensor::from_floats(std::vector<float>(qf.begin(), qf.begin() + 2 * heads * D), {2, heads, D});
  const Tensor lens = Tensor::from_i32({24, 10}, {2});
  const Tensor tables = Tensor::from_i32({0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 0, 0}, {2, 6});
  const Tensor q_pre = Tensor::from_floats(qf, {3, heads, D});
  const Tensor qsl = Tensor::from_i32({0, 2, 3}, {3});
  baseline::FlashAttnDecode dec(heads, D, sm, kv_heads);
  baseline::FlashAttnPrefill pre(heads, D, sm, kv_heads);
  auto both = [&](const std::pair<Tensor, Tensor>& c, KVScales sc) {
    return std::pair{dec.forward(q_dec, c.first, c.second, lens, tables, 24, sc),
                     pre.forward(q_pre, c.first, c.second, qsl, lens, tables, 2, 24, sc)};
  };
  const KVScales calibrated{2.5f, 1.0f / 64};  // about max |x| / 448, rounded up to few bits
  const auto fp8 = store(DType::fp8e4m3, calibrated);
  // The same pages dequantized into f32: e * scale.
  auto dequant = [](const Tensor& c, float scale) {
    std::vector<float> x = c.to_floats();
    for (float& e : x) e *= scale;
    return Tensor::from_floats(x, c.shape());
  };
  const auto scaled = both(fp8, calibrated);
  const auto as_f32 = both({dequant(fp8.first, calibrated.k), dequant(fp8.second, calibrated.v)}, {});
  EXPECT_EQ(scaled.first.to_floats(), as_f32.first.to_floats()) << "decode";
  EXPECT_EQ(scaled.second.to_floats(), as_f32.second.to_floats()) << "prefill";

  // Against full precision: the calibrated scales keep the keys (std 300, beyond e4m3's 448 at the tails) in range;
  // scale 1.0 saturates them and the scores move by a large fraction.
  const auto exact = both(store(DType::f32, {}), {});
  const auto unscaled = both(store(DType::fp8e4m3, {}), {});
  auto max_err = [](const Tensor& a, const Tensor& b) {
    const std::vector<float> x = a.to_floats(), y = b.to_floats();
    double m = 0;
    for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - double(y[i])));
    return m;
  };
  const double err_scaled = std::max(max_err(scaled.first, exact.first), max_err(scaled.second, exact.second));
  const double err_unscaled = std::max(max_err(unscaled.first, exact.first), max_err(unscaled.second, exact.second));
  const double largest = max_err(exact.first, Tensor::zeros(exact.first.shape(), DType::f32, Device::cpu()));
  std::printf("attention output error against f32 pages: calibrated scales %.4g, scale 1.0 %.4g (largest |output| "
              "%.4g)\n", err_scaled, err_unscaled, largest);
  EXPECT_LT(err_scaled, 0.2 * largest);  // measured 0.12: the values keep 3 mantissa bits
  EXPECT_GT(err_unscaled, 3 * err_scaled);  // measured 4.2x

  // 16-bit pages with a scale are refused, as are scales on the attention ops' f32 pages.
  const auto f32 = store(DType::f32, {});
  const std::string e = error_of([&] { dec.forward(q_dec, f32.first, f32.second, lens, tables, 24, {1.0f, 2.0f}); });
  EXPECT_NE(e.find("flash_attn_decode: argument 'v_scale' is 2, but the pages are f32"), std::string::npos) << e;
  const std::string p =
      error_of([&] { pre.forward(q_pre, f32.first, f32.second, qsl, lens, tables, 2, 24, {0.5f, 1.0f}); });
  EXPECT_NE(p.find("flash_attn_prefill: argument 'k_scale' is 0.5"), std::string::npos) << p;
}

// Checkpoint names of the scales, as quantizers write them (vLLM's maybe_remap_kv_scale_name).
TEST(KvCacheScales, CheckpointNamesMapToTheAttentionLayer) {
  using V = std::vector<std::string>;
  EXPECT_EQ(kv_scale_params("model.layers.3.self_attn.k_scale"), V{"model.layers.3.self_attn.attn.k_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.3.self_attn.v_scale"), V{"model.layers.3.self_attn.attn.v_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.0.self_attn.k_proj.k_scale"), V{"model.layers.0.self_attn.attn.k_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.0.self_attn.v_proj.v_scale"), V{"model.layers.0.self_attn.attn.v_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.1.self_attn.k_proj.output_scale"),
            V{"model.layers.1.self_attn.attn.k_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.1.self_attn.v_proj.output_scale"),
            V{"model.layers.1.self_attn.attn.v_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.2.self_attn.qkv_proj.v_scale"), V{"model.layers.2.self_attn.attn.v_scale"});
  EXPECT_EQ(kv_scale_params("model.layers.2.self_attn.kv_scale"),
            (V{"model.layers.2.self_attn.attn.k_scale", "model.layers.2.self_attn.attn.v_scale"}));
  // Not scales: weights, an input scale of a quantized linear, the canonical name (an ordinary parameter).
  EXPECT_TRUE(kv_scale_params("model.layers.2.self_attn.k_proj.weight").empty());
  EXPECT_TRUE(kv_scale_params("model.layers.2.self_attn.k_proj.input_scale").empty());
  EXPECT_TRUE(kv_scale_params("model.layers.2.self_attn.attn.k_scale").empty());
}

// The fixture's checkpoint plus `extra` tensors.
WeightSource with_tensors(const std::string& weights_path, std::vector<std::pair<std::string, Tensor>> extra) {
  return [=](const WeightVisitor& visit) {
    Checkpoint::open(weights_path).for_each(visit);
    for (const auto& [name, t] : extra) visit(name, t);
  };
}

float param_value(const CausalLM& model, const std::string& name) {
  return model.parameter(name).tensor->to_floats()[0];
}

// Loading: the scales land in each layer's attention (1.0 where the checkpoint has none), "kv_scale" fills both,
// and a scale that is not one positive number, or one for a layer without K/V pages (MLA's latent cache), is an
// error naming the checkpoint tensor.
TEST(KvCacheScales, CheckpointScalesLoadIntoTheAttentionLayers) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-llama");
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  EXPECT_EQ(param_value(*model, "model.layers.0.self_attn.attn.k_scale"), 1.0f);
  EXPECT_EQ(param_value(*model, "model.layers.1.self_attn.attn.v_scale"), 1.0f);
  model->load_weights(with_tensors(fx.spec.weights_path,
                                   {{"model.layers.0.self_attn.k_scale", Tensor::from_floats({0.25f}, {})},
                                    {"model.layers.0.self_attn.v_scale", Tensor::from_floats({3.0f}, {1}, DType::bf16)},
                                    {"model.layers.1.self_attn.kv_scale", Tensor::from_floats({0.5f}, {1})}}));
  EXPECT_EQ(param_value(*model, "model.layers.0.self_attn.attn.k_scale"), 0.25f);
  EXPECT_EQ(param_value(*model, "model.layers.0.self_attn.attn.v_scale"), 3.0f);
  EXPECT_EQ(param_value(*model, "model.layers.1.self_attn.attn.k_scale"), 0.5f);
  EXPECT_EQ(param_value(*model, "model.layers.1.self_attn.attn.v_scale"), 0.5f);

  auto load_error = [&](const std::string& name, const Tensor& t) {
    return error_of([&] { model->load_weights(with_tensors(fx.spec.weights_path, {{name, t}})); });
  };
  const std::string per_head = load_error("model.layers.0.self_attn.k_scale", Tensor::from_floats({1.f, 2.f}, {2}));
  EXPECT_NE(per_head.find("'model.layers.0.self_attn.k_scale': expected one per-tensor KV-cache scale (shape [] or [1])"),
            std::string::npos)
      << per_head;
  const std::string zero = load_error("model.layers.1.self_attn.v_proj.v_scale", Tensor::from_floats({0.f}, {1}));
  EXPECT_NE(zero.find("a KV-cache scale must be positive, got 0"), std::string::npos) << zero;
  const std::string inf =
      load_error("model.layers.1.self_attn.v_scale", Tensor::from_floats({std::numeric_limits<float>::infinity()}, {1}));
  EXPECT_NE(inf.find("values that are NaN or Inf"), std::string::npos) << inf;

  const test::HfFixture mla = test::load_hf_fixture("tiny-deepseek-v2");
  auto ds = engine::build_model(mla.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  const std::string latent = error_of([&] {
    ds->load_weights(with_tensors(mla.spec.weights_path,
                                  {{"model.layers.0.self_attn.k_scale", Tensor::from_floats({0.5f}, {1})}}));
  });
  EXPECT_NE(latent.find("checkpoint tensor 'model.layers.0.self_attn.k_scale' is a per-tensor fp8 KV-cache scale, but "
                        "this layer has no scaled K/V pages"),
            std::string::npos)
      << latent;
}

// A config's quantization_config: compressed-tensors quantizing only the KV cache loads (16-bit weights plus the
// scales); quantized weights, or a KV scheme other than static fp8 per tensor, are refused naming why.
TEST(KvCacheScales, OnlyKvCacheQuantizationIsAccepted) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-llama");
  auto with = [&](const std::string& q) {
    engine::ModelSpec s = fx.spec;
    s.config = s.config.with_overrides("{\"quantization_config\": " + q + "}", "test");
    return error_of([&] { engine::check_checkpoint_quantization(s); });
  };
  const std::string kv = R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
      "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": false, "symmetric": true}})";
  EXPECT_EQ(with(kv), "");
  const std::string weights = with(R"({"quant_method": "compressed-tensors", "config_groups": {"group_0": {}},
      "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": false}})");
  EXPECT_NE(weights.find("the checkpoint is quantized ('quantization_config'); kb-nano loads 16- and 32-bit"),
            std::string::npos)
      << weights;
  EXPECT_NE(with(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})").find("the checkpoint is quantized"),
            std::string::npos);
  const std::string head = with(R"({"quant_method": "compressed-tensors",
      "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "attn_head", "dynamic": false}})");
  EXPECT_NE(head.find("kv_cache_scheme must be static fp8 per tensor"), std::string::npos) << head;
  EXPECT_NE(head.find("strategy 'attn_head'"), std::string::npos) << head;
  const std::string int8 = with(R"({"quant_method": "compressed-tensors",
      "kv_cache_scheme": {"type": "int", "num_bits": 8, "strategy": "tensor", "dynamic": false}})");
  EXPECT_NE(int8.find("got type 'int'"), std::string::npos) << int8;
}

// End to end: tiny-llama's prompts with fp8 pages and calibrated-looking scales (k 1.3, v 0.7) in the checkpoint
// give prompt logits as close to full-precision pages as scale 1.0 does (same rounding budget), yet not the same
// logits (the scales reach the store and both attention ops); the engine gives the same tokens as batched
// generation. With 16-bit (here f32) pages the scales are ignored, as in vLLM: the logits are the unscaled model's.
TEST(KvCacheScales, CheckpointScalesReachTheEngine) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-llama");
  auto plain = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  auto scaled = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  std::vector<std::pair<std::string, Tensor>> scales;
  for (int l = 0; l < 2; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".self_attn.";
    scales.emplace_back(layer + "k_scale", Tensor::from_floats({1.3f}, {}));
    scales.emplace_back(layer + "v_scale", Tensor::from_floats({0.7f}, {}));
  }
  scaled->load_weights(with_tensors(fx.spec.weights_path, scales));
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : fx.expected["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
  engine::GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.return_prompt_logits = true;
  opt.block_size = 4;
  auto run = [&](CausalLM& m, const std::string& kv) {
    engine::GenerateOptions o = opt;
    o.kv_cache_dtype = kv;
    return engine::generate_tokens(m, prompts, Device::cpu(), Variant::baseline, o);
  };
  const engine::GenerateResult full = run(*plain, "auto"), fp8 = run(*plain, "fp8"), fp8_scaled = run(*scaled, "fp8"),
                               full_scaled = run(*scaled, "auto");
  double err = 0, err_scaled = 0, moved = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float> x = full.prompt_logits[i].to_floats(), y = fp8.prompt_logits[i].to_floats(),
                             z = fp8_scaled.prompt_logits[i].to_floats();
    EXPECT_EQ(full_scaled.prompt_logits[i].to_floats(), x) << "16-bit pages ignore the scales, prompt " << i;
    for (size_t j = 0; j < x.size(); ++j) {
      err = std::max(err, std::fabs(double(x[j]) - double(y[j])));
      err_scaled = std::max(err_scaled, std::fabs(double(x[j]) - double(z[j])));
      moved = std::max(moved, std::fabs(double(y[j]) - double(z[j])));
    }
  }
  std::printf("tiny-llama fp8 KV: max |logit error| %.4g with scale 1.0, %.4g with k 1.3 / v 0.7 (the two differ by "
              "up to %.4g)\n", err, err_scaled, moved);
  EXPECT_GT(moved, 0.0) << "the checkpoint's scales did not reach the pages";
  EXPECT_LT(err_scaled, 2 * err + 1e-6);

  const auto engine_tokens = engine_fp8_tokens(*scaled, prompts, opt.max_new_tokens);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(engine_tokens[i], fp8_scaled.tokens[i]) << "the engine's tokens with scaled fp8 pages, prompt " << i;
}

// A checkpoint as llm-compressor writes one for an fp8 KV cache alone: 16-bit weights, a scalar k_scale / v_scale per
// attention layer, and a compressed-tensors quantization_config with a kv_cache_scheme and no config_groups. It loads
// through resolve_model / build_model, at TP 1 and on each rank at TP 2 (the scales are per tensor: every rank gets
// them whole), and the same folder with a weight-quantizing config_groups is refused.
TEST(KvCacheScales, AKvCacheOnlyCompressedTensorsCheckpointLoads) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-llama");
  const std::filesystem::path dir = test::temp_dir("kbn_kv_only_ckpt");
  auto write_config = [&](const std::string& quantization) {
    const ModelConfig c = fx.spec.config.with_overrides("{\"quantization_config\": " + quantization + "}", "test");
    std::ofstream(dir / "config.json") << c.dump();
  };
  const std::string kv_scheme = R"("kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor",
      "dynamic": false, "symmetric": true})";
  write_config(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}, )" +
               kv_scheme + "}");
  std::vector<std::pair<std::string, Tensor>> tensors;
  Checkpoint::open(fx.spec.weights_path).for_each([&](const std::string& name, const Tensor& t) {
    tensors.emplace_back(name, t.clone());
  });
  const std::vector<float> k = {0.125f, 0.5f}, v = {2.0f, 0.75f};
  for (int l = 0; l < 2; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".self_attn.";
    tensors.emplace_back(layer + "k_scale", Tensor::from_floats({k[size_t(l)]}, {}));
    tensors.emplace_back(layer + "v_scale", Tensor::from_floats({v[size_t(l)]}, {}));
  }
  save_safetensors((dir / "model.safetensors").string(), tensors);

  const engine::ModelSpec spec = engine::resolve_model(dir.string());
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  for (int l = 0; l < 2; ++l) {
    const std::string attn = "model.layers." + std::to_string(l) + ".self_attn.attn.";
    EXPECT_EQ(param_value(*model, attn + "k_scale"), k[size_t(l)]) << "layer " << l;
    EXPECT_EQ(param_value(*model, attn + "v_scale"), v[size_t(l)]) << "layer " << l;
  }
  // eval says which scales the fp8 pages use.
  if (const std::string k_nano = test::kb_nano(); !k_nano.empty()) {
    const test::ShellResult r = test::shell(k_nano + " eval --model " + dir.string() +
                                            " --kv-cache-dtype fp8 --num-requests 2 --device cpu");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("[baseline] fp8 KV scales from the checkpoint over 2 layers: k_scale 0.125..0.5, "
                            "v_scale 0.75..2"),
              std::string::npos)
        << r.output;
  }
  engine::TensorParallelGroup group(2, Device::cpu());
  const auto shards = engine::build_model_shards(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0, group);
  for (size_t r = 0; r < shards.size(); ++r) {
    EXPECT_EQ(param_value(*shards[r], "model.layers.1.self_attn.attn.k_scale"), k[1]) << "rank " << r;
    EXPECT_EQ(param_value(*shards[r], "model.layers.0.self_attn.attn.v_scale"), v[0]) << "rank " << r;
  }

  write_config(R"({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"]}}, )" +
               kv_scheme + "}");
  const engine::ModelSpec weights = engine::resolve_model(dir.string());
  const std::string e = error_of([&] { engine::build_model(weights, Variant::baseline, {DType::f32, Device::cpu()}, 0); });
  EXPECT_NE(e.find("the checkpoint is quantized ('quantization_config')"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

}  // namespace
