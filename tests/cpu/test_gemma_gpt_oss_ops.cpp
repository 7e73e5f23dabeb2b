// The L1 ops gpt-oss-20b and Gemma-3-12B need beyond Llama's, on CPU: their oracles against values computed by hand
// (or by an independent double-precision evaluation of vLLM's formulas, quoted below), the op layer's refusals, and
// the rope configs of the two real models. The validation contract at the real shapes runs in test_ops.cpp
// (PendingModels).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "L1/fused_experts.h"
#include "L1/fused_qk_norm_rope.h"
#include "L1/gelu_and_mul.h"
#include "L1/gemma_rms_norm.h"
#include "L1/rotary_embedding.h"
#include "L1/swiglu_oai_and_mul.h"
#include "engine/model_loader.h"
#include "kbn/config.h"
#include "kbn/model_view.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"
#include "reference/reference.h"
#include "test_errors.h"

using namespace kbn;
using kbn::test::error_of;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Tensor floats(const std::vector<float>& v, const Shape& shape) { return Tensor::from_floats(v, shape); }

// ---- GemmaRMSNorm ----

TEST(GemmaRmsNorm, ScalesByOnePlusWeight) {
  // Row [3, 4]: mean square 12.5. Weight [0.5, -1]: scales 1.5 and 0.
  Tensor out = Tensor::empty({1, 2}, DType::f32);
  reference::gemma_rms_norm(out, floats({3, 4}, {1, 2}), floats({0.5f, -1.f}, {2}), 1e-6);
  const std::vector<float> o = out.to_floats();
  EXPECT_NEAR(o[0], 1.2727921552241004, 1e-6);
  EXPECT_EQ(o[1], 0.f);
  // A freshly built GemmaRMSNorm holds zeros: the plain RMS norm.
  baseline::GemmaRMSNorm norm(2, 1e-6);
  EXPECT_EQ(norm.weight.to_floats(), (std::vector<float>{0, 0}));
  const std::vector<float> unit = norm.forward(floats({3, 4}, {1, 2})).to_floats();
  EXPECT_NEAR(unit[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(unit[1], 4 / std::sqrt(12.5), 1e-6);
}

TEST(GemmaRmsNorm, FusedAddRoundsTheResidualAndNormsIt) {
  // bf16: 1 + 2^-9 rounds to 1, so the new residual is exactly [1, 1] and the norm reads that.
  baseline::GemmaRMSNorm norm(2, 1e-6, {DType::bf16, Device::cpu()});
  norm.weight.copy_(floats({1.f, 0.f}, {2}));
  Tensor x = floats({1.f, 0.5f}, {1, 2}).to(DType::bf16);
  Tensor residual = floats({std::ldexp(1.f, -9), 0.5f}, {1, 2}).to(DType::bf16);
  auto [y, r] = norm.forward(x, residual);
  EXPECT_EQ(r.to_floats(), (std::vector<float>{1.f, 1.f}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{2.f, 1.f}));  // rms 1: scales 2 and 1
  EXPECT_EQ(x.to_floats(), y.to_floats());                   // in place
}

TEST(GemmaRmsNorm, RefusesBadArguments) {
  std::string msg = error_of([] { baseline::GemmaRMSNorm(0); });
  EXPECT_TRUE(contains(msg, "GemmaRMSNorm") && contains(msg, "'hidden_size'") && contains(msg, "got 0")) << msg;
  msg = error_of([] { baseline::GemmaRMSNorm(4, 0.0); });
  EXPECT_TRUE(contains(msg, "'eps'") && contains(msg, "positive")) << msg;
  baseline::GemmaRMSNorm norm(4);
  msg = error_of([&] { norm.forward(Tensor::zeros({2, 5}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "gemma_rms_norm") && contains(msg, "'x'") && contains(msg, "hidden_size")) << msg;
  msg = error_of([&] { norm.forward(Tensor::zeros({2, 4}, DType::f32), Tensor::zeros({3, 4}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "gemma_fused_add_rms_norm") && contains(msg, "'residual'")) << msg;
  msg = error_of([&] { norm.forward(Tensor::zeros({2, 4}, DType::bf16)); });
  EXPECT_TRUE(contains(msg, "'x'") && contains(msg, "'weight'")) << msg;
}

// ---- GeluAndMul ----

TEST(GeluAndMul, ExactAndTanhMatchTheirDefinitions) {
  // Gates [1, -1], ups [2, 3]. gelu(1) = Phi(1) = 0.841344746..., tanh form 0.841191990...
  const Tensor x = floats({1, -1, 2, 3}, {1, 4});
  const std::vector<float> exact = baseline::GeluAndMul("none").forward(x).to_floats();
  EXPECT_NEAR(exact[0], 1.6826894921370859, 1e-6);
  EXPECT_NEAR(exact[1], -0.4759657617943712, 1e-6);
  const std::vector<float> tanh = baseline::GeluAndMul("tanh").forward(x).to_floats();
  EXPECT_NEAR(tanh[0], 1.6823839812165535, 1e-6);
  EXPECT_NEAR(tanh[1], -0.4764240281751697, 1e-6);
}

TEST(GeluAndMul, RefusesBadArguments) {
  std::string msg = error_of([] { baseline::GeluAndMul("erf"); });
  EXPECT_TRUE(contains(msg, "'approximate'") && contains(msg, "\"none\" or \"tanh\"") && contains(msg, "erf")) << msg;
  msg = error_of([] { baseline::GeluAndMul("tanh").forward(Tensor::zeros({2, 5}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "gelu_and_mul") && contains(msg, "'x'") && contains(msg, "even")) << msg;
  msg = error_of([] { baseline::GeluAndMul("tanh").forward(Tensor::zeros({2, 3, 4}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "gelu_and_mul") && contains(msg, "'x'")) << msg;
}

// ---- SwigluOAIAndMul ----

TEST(SwigluOaiAndMul, InterleavedClampedAndShifted) {
  // Pairs (gate, up): (1, 2) -> 3 sigmoid(1.702); (10, -9) -> gate 7, up -7: -6 * 7 sigmoid(11.914);
  // (-3, 8) -> up 7: 8 * -3 sigmoid(-5.106).
  const Tensor x = floats({1, 2, 10, -9, -3, 8}, {1, 6});
  const std::vector<float> o = baseline::SwigluOAIAndMul(1.702, 7.0).forward(x).to_floats();
  ASSERT_EQ(o.size(), 3u);
  EXPECT_NEAR(o[0], 2.537387297798464, 1e-6);
  EXPECT_NEAR(o[1], -41.99971876981991, 1e-5);
  EXPECT_NEAR(o[2], -0.14457047766228776, 1e-6);
}

TEST(SwigluOaiAndMul, RefusesBadArguments) {
  std::string msg = error_of([] { baseline::SwigluOAIAndMul(1.702, 0.0); });
  EXPECT_TRUE(contains(msg, "SwigluOAIAndMul") && contains(msg, "'limit'") && contains(msg, "positive")) << msg;
  msg = error_of([] { baseline::SwigluOAIAndMul(std::nan(""), 7.0); });
  EXPECT_TRUE(contains(msg, "'alpha'") && contains(msg, "finite")) << msg;
  msg = error_of([] { baseline::SwigluOAIAndMul().forward(Tensor::zeros({2, 7}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "swiglu_oai_and_mul") && contains(msg, "'x'") && contains(msg, "even")) << msg;
}

// ---- rotary scalings ----

// gpt-oss-20b's rope: head_dim 64, theta 150000, YaRN factor 32 over an original context of 4096, betas 32 and 1.
RopeScaling gpt_oss_yarn(bool truncate) {
  RopeScaling s;
  s.rope_type = "yarn";
  s.factor = 32.0;
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 32.0;
  s.beta_slow = 1.0;
  s.truncate = truncate;
  return s;
}

TEST(RopeScaling, YarnFrequenciesOfGptOss) {
  // Expected values: vLLM's _compute_inv_freq evaluated independently in double. The correction range is
  // [d(32), d(1)] = [8.0928, 17.3980] (d(r) = 64 ln(4096 / (2 pi r)) / (2 ln 150000)); truncated [8, 18].
  struct Want {
    int i;
    double untruncated, truncated;
  };
  const Want want[] = {{0, 1.0, 1.0},
                       {8, 0.050813274815461475, 0.050813274815461475},
                       {9, 0.03170569618466377, 0.031620752275346484},
                       {12, 0.006794959489732219, 0.007015713910504388},
                       {17, 0.0001293187012450632, 0.00022794779579512524},
                       {18, 3.8308812373753384e-05, 3.8308812373753384e-05},
                       {31, 3.0235114281192144e-07, 3.0235114281192144e-07}};
  const std::vector<double> plain = reference::rope_inv_freq(64, 150000.0, gpt_oss_yarn(false));
  const std::vector<double> trunc = reference::rope_inv_freq(64, 150000.0, gpt_oss_yarn(true));
  ASSERT_EQ(plain.size(), 32u);
  for (const Want& w : want) {
    EXPECT_NEAR(plain[size_t(w.i)], w.untruncated, 1e-12 * (1 + w.untruncated * 1e6)) << "frequency " << w.i;
    EXPECT_NEAR(trunc[size_t(w.i)], w.truncated, 1e-12 * (1 + w.truncated * 1e6)) << "frequency " << w.i;
  }
  // The attention factor 0.1 ln 32 + 1 multiplies cos and sin (vLLM's mscale, HF's attention_factor).
  EXPECT_NEAR(reference::rope_attention_scaling(gpt_oss_yarn(false)), 1.3465735902799727, 1e-12);
  const std::vector<float> row = reference::rope_cos_sin_cache(64, 3, 150000.0, gpt_oss_yarn(false)).to_floats();
  EXPECT_NEAR(row[64 + 0], 1.3465735902799727 * std::cos(1.0), 1e-6);  // position 1, cos of frequency 0
  EXPECT_NEAR(row[64 + 32 + 9], 1.3465735902799727 * std::sin(0.03170569618466377), 1e-7);
  EXPECT_NEAR(row[0], 1.3465735902799727, 1e-6);  // position 0: cos 1, scaled
  RopeScaling given = gpt_oss_yarn(false);
  given.attention_factor = 1.25;
  EXPECT_EQ(reference::rope_attention_scaling(given), 1.25);
}

TEST(RopeScaling, LinearDividesEveryFrequency) {
  RopeScaling linear;
  linear.rope_type = "linear";
  linear.factor = 8.0;
  const std::vector<double> plain = reference::rope_inv_freq(256, 1e6, {});
  const std::vector<double> scaled = reference::rope_inv_freq(256, 1e6, linear);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8.0) << i;
  EXPECT_EQ(reference::rope_attention_scaling(linear), 1.0);
}

TEST(RopeScaling, RefusesBadScalings) {
  RopeScaling s = gpt_oss_yarn(false);
  s.factor = 0;
  std::string msg = error_of([&] { reference::rope_inv_freq(64, 150000.0, s); });
  EXPECT_TRUE(contains(msg, "'scaling.factor'") && contains(msg, "positive")) << msg;
  s = gpt_oss_yarn(false);
  s.beta_fast = 1.0;
  s.beta_slow = 32.0;
  msg = error_of([&] { reference::rope_inv_freq(64, 150000.0, s); });
  EXPECT_TRUE(contains(msg, "'scaling.beta_fast'") && contains(msg, "beta_slow < beta_fast")) << msg;
  s = gpt_oss_yarn(false);
  s.original_max_position_embeddings = 0;
  msg = error_of([&] { reference::rope_inv_freq(64, 150000.0, s); });
  EXPECT_TRUE(contains(msg, "'scaling.original_max_position_embeddings'")) << msg;
  RopeScaling linear;
  linear.rope_type = "linear";
  linear.factor = -2;
  msg = error_of([&] { reference::rope_inv_freq(64, 1e4, linear); });
  EXPECT_TRUE(contains(msg, "'scaling.factor'") && contains(msg, "-2")) << msg;
  msg = error_of([&] {
    baseline::RotaryEmbedding(64, 64, 4096, 150000.0, true, [] {
      RopeScaling y = gpt_oss_yarn(false);
      y.factor = 0;
      return y;
    }());
  });
  EXPECT_TRUE(contains(msg, "'rope_scaling.factor'")) << msg;
}

TEST(RopeScaling, YarnTableCoversTheStretchedContext) {
  // vLLM's YaRN table has max(original * factor, max_position) rows.
  baseline::RotaryEmbedding rope(64, 64, 1024, 150000.0, true, gpt_oss_yarn(false));
  EXPECT_EQ(rope.cos_sin_cache.size(0), 4096 * 32);
  baseline::RotaryEmbedding plain(64, 64, 1024, 150000.0, true, {});
  EXPECT_EQ(plain.cos_sin_cache.size(0), 1024);
}

// ---- the real configs' ropes ----

TEST(RopeScaling, RealConfigsParse) {
  const ModelConfig gpt_oss = engine::resolve_model("gpt-oss-20b").config;
  const RopeConfig g = parse_rope_config(gpt_oss, 10000.0);
  EXPECT_EQ(g.theta, 150000.0);
  EXPECT_EQ(g.scaling.rope_type, "yarn");
  EXPECT_EQ(g.scaling.factor, 32.0);
  EXPECT_EQ(g.scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(g.scaling.beta_fast, 32.0);
  EXPECT_EQ(g.scaling.beta_slow, 1.0);
  EXPECT_FALSE(g.scaling.truncate);  // gpt-oss says false; vLLM's and HF's default would be true

  const ModelConfig gemma = engine::resolve_model("gemma-3-12b-it").config.sub("text_config");
  const RopeConfig m = parse_rope_config(gemma, 10000.0);
  EXPECT_EQ(m.theta, 1e6);
  EXPECT_EQ(m.scaling.rope_type, "linear");
  EXPECT_EQ(m.scaling.factor, 8.0);
  const ModelView v = ModelView::from("gemma-3-12b-it", std::make_shared<const ModelConfig>(gemma), 1);
  EXPECT_EQ(v.hidden_size, 3840);
  EXPECT_EQ(*v.intermediate_size, 15360);
  EXPECT_EQ(v.attention->head_dim, 256);
}

}  // namespace

namespace {

// ---- fused_experts with gpt-oss's activation and biases ----

// One token, one expert (weight 0.75), hidden 2, inter 2, by hand: w13 = identity rows for gate (x0, x1) and up (x1,
// x0), b13 = (1, -1 | 0.5, 9), so g = (x0 + 1, x1 - 1), u = (x1 + 0.5, x0 + 9); with x = (2, 1) and limit 2.5:
// g' = (2.5 clamped from 3, 0), u' = (1.5, 2.5 clamped from 11); a = (u' + 1) g' sigmoid(1.702 g') = (2.5 * 2.5 *
// sigmoid(4.255), 0); w2 = [[1, 0], [2, 3]], b2 = (0.25, -0.5): y = (a0 + 0.25, 2 a0 - 0.5); out = 0.75 y.
TEST(FusedExpertsSwigluoai, OracleMatchesAHandComputation) {
  const Tensor x = floats({2, 1}, {1, 2});
  const Tensor w13 = floats({1, 0, 0, 1, 0, 1, 1, 0}, {1, 4, 2});
  const Tensor w2 = floats({1, 0, 2, 3}, {1, 2, 2});
  const Tensor b13 = floats({1, -1, 0.5f, 9}, {1, 4}), b2 = floats({0.25f, -0.5f}, {1, 2});
  const Tensor w = floats({0.75f}, {1, 1}), ids = Tensor::from_i32({0}, {1, 1});
  Tensor out = Tensor::empty({1, 2}, DType::f32);
  reference::ExpertFeatures f{.activation = reference::ExpertFeatures::Activation::swigluoai,
                              .alpha = 1.702,
                              .limit = 2.5,
                              .w13_bias = &b13,
                              .w2_bias = &b2};
  reference::fused_experts(out, x, w13, w2, w, ids, f);
  const double a0 = 2.5 * 2.5 / (1.0 + std::exp(-1.702 * 2.5));
  const std::vector<float> o = out.to_floats();
  EXPECT_NEAR(o[0], 0.75 * (a0 + 0.25), 1e-6);
  EXPECT_NEAR(o[1], 0.75 * (2 * a0 - 0.5), 1e-6);
  // silu without biases on the same weights: silu(2) * 1 in the first channel, silu(1) * 2 in the second.
  reference::fused_experts(out, x, w13, w2, w, ids);
  const double s0 = 2.0 / (1 + std::exp(-2.0)) * 1.0, s1 = 1.0 / (1 + std::exp(-1.0)) * 2.0;
  EXPECT_NEAR(out.to_floats()[0], 0.75 * s0, 1e-6);
  EXPECT_NEAR(out.to_floats()[1], 0.75 * (2 * s0 + 3 * s1), 1e-6);
}

TEST(FusedExpertsSwigluoai, BadBiasesAndLimitsAreNamed) {
  const Tensor x = floats({2, 1}, {1, 2});
  const Tensor w13 = floats({1, 0, 0, 1, 0, 1, 1, 0}, {1, 4, 2});
  const Tensor w2 = floats({1, 0, 2, 3}, {1, 2, 2});
  const Tensor w = floats({0.75f}, {1, 1}), ids = Tensor::from_i32({0}, {1, 1});
  const Tensor short_b13 = floats({1, 2, 3}, {1, 3}), b2 = floats({0.25f, -0.5f}, {1, 2});
  Tensor out = Tensor::empty({1, 2}, DType::f32);
  reference::ExpertFeatures f{.w13_bias = &short_b13, .w2_bias = &b2};
  EXPECT_TRUE(contains(error_of([&] { reference::fused_experts(out, x, w13, w2, w, ids, f); }), "w13_bias"));
  EXPECT_TRUE(contains(error_of([] { baseline::FusedExperts(baseline::FusedExperts::Activation::swigluoai, 1.702, 0); }),
                       "argument 'limit' (swigluoai) must be positive, got 0"));
  const Tensor b2_f16 = b2.to(DType::f16);
  EXPECT_TRUE(contains(error_of([&] {
                         baseline::FusedExperts().forward(x, w13, w2, w, ids, floats({1, -1, 0.5f, 9}, {1, 4}), b2_f16);
                       }),
                       "argument 'w2_bias' must have the experts' dtype f32, got f16"));
}

// fused_qk_norm_rope's forward_store (Qwen3's and Gemma-3's q/k norms + rope + paged store): q as forward gives it,
// the pages as store_kvcache's oracle writes forward's k and qkv's v heads (slot -1 skipped); bad pages named.
TEST(FusedQKNormRopeStore, QAndPagesOfForwardThenTheStore) {
  const int64_t T = 3, H = 2, Hk = 1, D = 4, W = (H + 2 * Hk) * D;
  Tensor qkv = Tensor::empty({T, W}, DType::f32), qw = Tensor::empty({D}, DType::f32), kw = Tensor::empty({D}, DType::f32);
  fill_normal_(qkv, 51, 0.0, 1.0);
  fill_normal_(qw, 52, 0.0, 1.0);
  fill_normal_(kw, 53, 0.0, 1.0);
  const Tensor table = reference::rope_cos_sin_cache(D, 16, 10000.0, RopeScaling{});
  const Tensor positions = Tensor::from_i64({1, 5, 9}, {T}), slots = Tensor::from_i64({6, -1, 0}, {T});
  baseline::FusedQKNormRope op(H, Hk, D, 1e-6, 1.0);
  const auto [q, k] = op.forward(qkv, positions, qw, kw, table);
  Tensor kc = Tensor::full({2, 4, Hk, D}, 7.0, DType::f32), vc = Tensor::full({2, 4, Hk, D}, 7.0, DType::f32);
  const Tensor qs = op.forward_store(qkv, positions, qw, kw, table, kc, vc, slots);
  EXPECT_EQ(qs.to_floats(), q.to_floats());
  Tensor kc2 = Tensor::full({2, 4, Hk, D}, 7.0, DType::f32), vc2 = Tensor::full({2, 4, Hk, D}, 7.0, DType::f32);
  const Tensor v = qkv.slice(1, (H + Hk) * D, W);
  reference::reshape_and_cache(k.view({T, Hk, D}), v.as_strided({T, Hk, D}, {v.stride(0), D, 1}, v.offset()), kc2,
                               vc2, slots);
  EXPECT_EQ(kc.to_floats(), kc2.to_floats());
  EXPECT_EQ(vc.to_floats(), vc2.to_floats());
  EXPECT_NE(kc.to_floats(), Tensor::full({2, 4, Hk, D}, 7.0, DType::f32).to_floats());  // something was stored
  const Tensor bad = Tensor::zeros({2, 4, Hk, D + 1}, DType::f32);
  EXPECT_TRUE(contains(error_of([&] { op.forward_store(qkv, positions, qw, kw, table, bad, vc, slots); }),
                       "argument 'key_cache'"));
  EXPECT_TRUE(contains(error_of([&] {
                         op.forward_store(qkv, positions, qw, kw, table, kc, vc.to(DType::bf16), slots);
                       }),
                       "'value_cache'"));
  EXPECT_TRUE(contains(error_of([&] {
                         op.forward_store(qkv, positions, qw, kw, table, kc, vc, Tensor::from_i32({0, 1, 2}, {T}));
                       }),
                       "'slot_mapping'"));
}

// forward_add (DeepSeek's routed + shared experts): the experts' output rounded to the activation dtype, plus the
// addend, rounded again; bf16 so both roundings show. By hand on the silu case above (no biases): out = 0.75 (silu(2)
// + 2 silu(2) + 3 silu(1)) per channel as computed there; the test compares against round(round(out) + addend).
TEST(FusedExpertsAdd, RoundsTheExpertsThenAddsTheAddend) {
  const Tensor x = floats({2, 1}, {1, 2}).to(DType::bf16);
  const Tensor w13 = floats({1, 0, 0, 1, 0, 1, 1, 0}, {1, 4, 2}).to(DType::bf16);
  const Tensor w2 = floats({1, 0, 2, 3}, {1, 2, 2}).to(DType::bf16);
  const Tensor w = floats({0.75f}, {1, 1}), ids = Tensor::from_i32({0}, {1, 1});
  const Tensor addend = floats({1000.f, -3.3f}, {1, 2}).to(DType::bf16);
  baseline::FusedExperts op;
  const std::vector<float> routed = op.forward(x, w13, w2, w, ids).to_floats(), add = addend.to_floats();
  const std::vector<float> got = op.forward_add(addend, x, w13, w2, w, ids).to_floats();
  for (int i = 0; i < 2; ++i) {
    const float want = floats({routed[i] + add[i]}, {1}).to(DType::bf16).to_floats()[0];
    EXPECT_EQ(got[i], want) << "channel " << i;
  }
  // 1000 + 1.32 in bf16 (steps of 4 between 512 and 1024) loses the experts' part: the sum was rounded.
  EXPECT_EQ(got[0], 1000.f);
  EXPECT_TRUE(contains(error_of([&] { op.forward_add(floats({1, 2, 3}, {1, 3}).to(DType::bf16), x, w13, w2, w, ids); }),
                       "argument 'addend'"));
  EXPECT_TRUE(contains(error_of([&] { op.forward_add(floats({1, 2}, {1, 2}), x, w13, w2, w, ids); }),
                       "'addend'"));
  EXPECT_TRUE(contains(error_of([&] { op.forward_add(Tensor(), x, w13, w2, w, ids); }), "argument 'addend'"));
}

}  // namespace
