// DeepSeek-V2 / V3 groundwork (issue 18): the typed config of both published configs (models/deepseek-v2-lite.json,
// models/deepseek-v3.json), its derived quantities (latent row, MLA softmax scale under YaRN, which layers are MoE)
// and its errors; the MLA oracles (tasks/reference/attention.cpp): the latent cache store, absorbed decode over the
// latent cache equal to the decompressed definition, and the decompressed definition equal to attention written out
// per token from unpaged latents.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "L1/concat_and_cache_mla.h"
#include "L1/fused_mla_rope_cache.h"
#include "L1/gather_cache.h"
#include "L1/mla_decode.h"
#include "L1/rms_norm.h"
#include "L1/rotary_embedding.h"
#include "L1/router_gemm.h"
#include "L2/deepseek_v2_moe.h"
#include "L4/deepseek_v2.h"
#include "configs/deepseek_v2.h"
#include "engine/model_loader.h"
#include "kbn/error.h"
#include "kbn/forward_context.h"
#include "kbn/model_view.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"
#include "reference/reference.h"

namespace {

using namespace kbn;

TEST(DeepseekV2Config, PublishedV2Lite) {
  const DeepseekV2Config d = DeepseekV2Config::from(engine::resolve_model("deepseek-v2-lite").config);
  EXPECT_EQ(d.num_heads, 16);
  EXPECT_EQ(d.q_lora_rank, 0);  // null: q_proj straight from the hidden state
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_EQ(d.qk_head_dim(), 192);
  EXPECT_EQ(d.latent_size(), 576);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.n_routed_experts, 64);
  EXPECT_EQ(d.n_shared_experts, 2);
  EXPECT_EQ(d.num_experts_per_tok, 6);
  EXPECT_EQ(d.topk_method, "greedy");
  EXPECT_EQ(d.scoring_func, "softmax");
  EXPECT_FALSE(d.norm_topk_prob);
  EXPECT_FALSE(d.is_moe_layer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(d.is_moe_layer(1));
  EXPECT_TRUE(d.is_moe_layer(26));
  // YaRN factor 40 with mscale = mscale_all_dim = 0.707: cos/sin unscaled, the softmax scale 192^-0.5 x 1.2608^2.
  EXPECT_EQ(d.rope.scaling.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(d.rope.scaling.attention_factor, 1.0);
  const double m = 0.1 * 0.707 * std::log(40.0) + 1;
  EXPECT_NEAR(d.softmax_scale(), m * m / std::sqrt(192.0), 1e-15);
  EXPECT_NEAR(d.softmax_scale(), 0.11473, 1e-5);
}

TEST(DeepseekV2Config, PublishedV3Router) {
  const DeepseekV2Config d = DeepseekV2Config::from(engine::resolve_model("deepseek-v3").config);
  EXPECT_EQ(d.num_heads, 128);
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.latent_size(), 576);
  EXPECT_EQ(d.topk_method, "noaux_tc");
  EXPECT_EQ(d.scoring_func, "sigmoid");
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.topk_group, 4);
  EXPECT_TRUE(d.norm_topk_prob);
  EXPECT_DOUBLE_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_FALSE(d.is_moe_layer(2));  // first_k_dense_replace 3
  EXPECT_TRUE(d.is_moe_layer(3));
  const double m = 0.1 * std::log(40.0) + 1;  // mscale_all_dim 1
  EXPECT_NEAR(d.softmax_scale(), m * m / std::sqrt(192.0), 1e-15);
}

TEST(DeepseekV2Config, TinyFixtureConfig) {
  // models/tiny-deepseek-v2.json, the shape of V2-Lite in miniature for a transformers fixture: a dense first layer,
  // MoE after with shared experts, YaRN with mscale != mscale_all_dim (so cos/sin scale = 1.0857 and the softmax scale
  // correction differ, both exercised).
  const DeepseekV2Config d = DeepseekV2Config::from(engine::resolve_model("tiny-deepseek-v2").config);
  EXPECT_EQ(d.latent_size(), 40);
  EXPECT_EQ(d.qk_head_dim(), 24);
  EXPECT_FALSE(d.is_moe_layer(0));
  EXPECT_TRUE(d.is_moe_layer(1) && d.is_moe_layer(2));
  EXPECT_NEAR(d.rope.scaling.attention_factor, yarn_mscale(4, 1.0) / yarn_mscale(4, 0.707), 1e-15);
  EXPECT_NEAR(d.softmax_scale(), std::pow(yarn_mscale(4, 0.707), 2) / std::sqrt(24.0), 1e-15);
}

TEST(DeepseekV2Config, ModelViewHasTheLatentAttentionAndTheExperts) {
  // What every op's test facts see of DeepSeek-V2-Lite: MLA (no per-head K/V attention), 64 experts of 1408 in the 26
  // layers after the first, and the first layer's dense MLP; at TP 2 the heads and each expert's width split.
  const engine::ModelSpec spec = engine::resolve_model("deepseek-v2-lite");
  const auto config = std::make_shared<const ModelConfig>(spec.config);
  const ModelView v = ModelView::from("deepseek-v2-lite", config, 1);
  ASSERT_TRUE(v.mla.has_value());
  EXPECT_FALSE(v.attention.has_value());
  EXPECT_EQ(v.mla->num_heads, 16);
  EXPECT_EQ(v.mla->latent_size(), 576);
  EXPECT_EQ(v.mla->qk_head_dim(), 192);
  EXPECT_EQ(v.mla->v_head_dim, 128);
  EXPECT_NEAR(v.mla->softmax_scale, DeepseekV2Config::from(spec.config).softmax_scale(), 1e-15);
  ASSERT_TRUE(v.moe.has_value());
  EXPECT_EQ(v.moe->num_experts, 64);
  EXPECT_EQ(v.moe->top_k, 6);
  EXPECT_EQ(v.moe->intermediate_size, 1408);
  EXPECT_FALSE(v.moe->renormalize);
  EXPECT_EQ(v.moe->num_sparse_layers, 26);
  EXPECT_EQ(v.moe->shared_intermediate_size, 2 * 1408);  // n_shared_experts 2
  ASSERT_TRUE(v.intermediate_size.has_value());
  EXPECT_EQ(*v.intermediate_size, 10944);
  const ModelView v2 = ModelView::from("deepseek-v2-lite", config, 2);
  EXPECT_EQ(v2.mla->num_heads, 8);
  EXPECT_EQ(v2.mla->latent_size(), 576);
  EXPECT_EQ(v2.moe->intermediate_size, 704);
  EXPECT_EQ(v2.moe->shared_intermediate_size, 1408);
}

TEST(DeepseekV2Config, BadFieldsAreNamed) {
  const ModelConfig lite = engine::resolve_model("deepseek-v2-lite").config;
  const auto error = [&](const std::string& overrides) -> std::string {
    try {
      DeepseekV2Config::from(lite.with_overrides(overrides, "t"));
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << overrides << " was accepted";
    return {};
  };
  const auto expect_in = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
  };
  expect_in(error(R"({"n_group": 3})"), "'n_group' (3) must divide 'n_routed_experts' (64)");
  expect_in(error(R"({"n_group": 4, "topk_group": 5})"), "'topk_group' (5) must be in [1, n_group = 4]");
  expect_in(error(R"({"qk_rope_head_dim": 63})"), "'qk_rope_head_dim' must be even");
  expect_in(error(R"({"kv_lora_rank": 0})"), "'kv_lora_rank' must be positive, got 0");
  expect_in(error(R"({"topk_method": "random"})"), "'topk_method' must be greedy, group_limited_greedy or noaux_tc");
  expect_in(error(R"({"scoring_func": "tanh"})"), "'scoring_func' must be softmax or sigmoid, got 'tanh'");
  expect_in(error(R"({"num_experts_per_tok": 65})"), "'num_experts_per_tok' (65) must be at most 'n_routed_experts'");
  expect_in(error(R"({"n_group": 8, "topk_group": 1, "num_experts_per_tok": 9})"),
            "'num_experts_per_tok' (9) exceeds the experts of 'topk_group' (1) groups of 8");
  expect_in(error(R"({"attention_bias": true})"), "'attention_bias' is true");
  // A dense config (no experts) needs none of the MoE keys.
  const DeepseekV2Config dense = DeepseekV2Config::from(lite.with_overrides(R"({"n_routed_experts": null})", "t"));
  EXPECT_EQ(dense.n_routed_experts, 0);
  EXPECT_FALSE(dense.is_moe_layer(5));
}

// ---- MLA oracles ----

// Small MLA shapes: 3 heads, latent 8 + rope 4, no-rope query 6, value 5, blocks of 4 rows; two sequences of 5 and 9
// tokens in scattered blocks.
struct MlaCase {
  int64_t H = 3, L = 8, R = 4, P = 6, V = 5, bs = 4, nb = 8;
  std::vector<int64_t> lens{5, 9};
  std::vector<std::vector<int32_t>> blocks{{6, 1}, {3, 7, 0}};
  Tensor kv_c, k_pe, w, cache;  // latents in token order (sequence 0 then 1), kv_b weight, the paged cache

  MlaCase() {
    const int64_t T = lens[0] + lens[1];
    kv_c = Tensor::empty({T, L}, DType::f32);
    k_pe = Tensor::empty({T, R}, DType::f32);
    w = Tensor::empty({H * (P + V), L}, DType::f32);
    fill_normal_(kv_c, 1, 0, 1);
    fill_normal_(k_pe, 2, 0, 1);
    fill_normal_(w, 3, 0, 0.4);
    cache = Tensor::full({nb, bs, L + R}, 7.0, DType::f32);  // rows no sequence owns keep a visible value
    std::vector<int32_t> slots;
    for (size_t b = 0; b < lens.size(); ++b)
      for (int64_t p = 0; p < lens[b]; ++p) slots.push_back(int32_t(blocks[b][size_t(p / bs)] * bs + p % bs));
    reference::concat_and_cache_mla(cache, kv_c, k_pe, Tensor::from_i32(slots, {T}));
  }
  Tensor block_tables() const { return Tensor::from_i32({6, 1, -1, 3, 7, 0}, {2, 3}); }
  Tensor seq_lens() const { return Tensor::from_i32({int32_t(lens[0]), int32_t(lens[1])}, {2}); }
  int64_t first_token(size_t b) const { return b == 0 ? 0 : lens[0]; }
};

TEST(MlaOracle, ConcatAndCacheWritesRowsAndSkipsPadding) {
  MlaCase c;
  // Token 6 of the batch is position 1 of sequence 1: block 3, row 1.
  const std::vector<double> row = c.cache.select(0, 3).select(0, 1).to_doubles();
  const std::vector<double> kv = c.kv_c.select(0, 6).to_doubles(), pe = c.k_pe.select(0, 6).to_doubles();
  for (int64_t i = 0; i < c.L; ++i) EXPECT_EQ(row[size_t(i)], kv[size_t(i)]);
  for (int64_t i = 0; i < c.R; ++i) EXPECT_EQ(row[size_t(c.L + i)], pe[size_t(i)]);
  EXPECT_EQ(c.cache.select(0, 2).to_doubles()[0], 7.0);  // a block no sequence owns is untouched
  Tensor cache = c.cache.clone();
  reference::concat_and_cache_mla(cache, c.kv_c.slice(0, 0, 2), c.k_pe.slice(0, 0, 2), Tensor::from_i32({-1, -1}, {2}));
  EXPECT_EQ(cache.to_doubles(), c.cache.to_doubles());  // -1: padding, nothing written
  const auto message = [&](const Tensor& slots, const Tensor& pe) {
    try {
      reference::concat_and_cache_mla(cache, c.kv_c.slice(0, 0, 2), pe, slots);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(Tensor::from_i32({0, 32}, {2}), c.k_pe.slice(0, 0, 2)).find("'slot_mapping'[1] = 32 is outside"),
            std::string::npos);
  EXPECT_NE(message(Tensor::from_i32({0, 1}, {2}), c.k_pe.slice(0, 0, 2).slice(1, 0, 3)).find("rows of 11 values"),
            std::string::npos);
}

TEST(MlaOracle, AbsorbedDecodeEqualsTheDecompressedDefinition) {
  MlaCase c;
  const double scale = 0.37;
  const int64_t B = 2, D = c.P + c.R;
  Tensor q = Tensor::empty({B, c.H, D}, DType::f32);
  fill_normal_(q, 4, 0, 1);
  // The definition: one query per sequence at its last position (query_start_loc 0, 1, 2).
  Tensor direct = Tensor::empty({B, c.H, c.V}, DType::f32);
  reference::mla_attention(direct, q, c.cache, c.w, Tensor::from_i32({0, 1, 2}, {3}), c.seq_lens(), c.block_tables(),
                           scale);
  // Absorbed: q_lat = W_UK_h^T q_nope | q_pe over the latent cache, then W_UV_h on the latent output.
  const std::vector<double> qv = q.to_doubles(), w = c.w.to_doubles();
  std::vector<float> q_lat(size_t(B * c.H * (c.L + c.R)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const double* qh = &qv[size_t((b * c.H + h) * D)];
      float* ql = &q_lat[size_t((b * c.H + h) * (c.L + c.R))];
      for (int64_t l = 0; l < c.L; ++l) {
        double acc = 0;
        for (int64_t i = 0; i < c.P; ++i) acc += w[size_t((h * (c.P + c.V) + i) * c.L + l)] * qh[i];
        ql[l] = float(acc);
      }
      for (int64_t i = 0; i < c.R; ++i) ql[c.L + i] = float(qh[c.P + i]);
    }
  Tensor lat_out = Tensor::empty({B, c.H, c.L}, DType::f32);
  reference::mla_decode(lat_out, Tensor::from_floats(q_lat, {B, c.H, c.L + c.R}), c.cache, c.seq_lens(),
                        c.block_tables(), scale);
  const std::vector<double> lo = lat_out.to_doubles(), dv = direct.to_doubles();
  double max_err = 0, max_val = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t v = 0; v < c.V; ++v) {
        double acc = 0;
        for (int64_t l = 0; l < c.L; ++l)
          acc += w[size_t((h * (c.P + c.V) + c.P + v) * c.L + l)] * lo[size_t((b * c.H + h) * c.L + l)];
        const double ref = dv[size_t((b * c.H + h) * c.V + v)];
        max_err = std::max(max_err, std::abs(acc - ref));
        max_val = std::max(max_val, std::abs(ref));
      }
  EXPECT_GT(max_val, 0.1);
  EXPECT_LT(max_err, 2e-6 * std::max(1.0, max_val)) << "absorbed and decompressed MLA disagree";
}

TEST(MlaOracle, DecompressedDefinitionIsCausalAttentionPerHead) {
  MlaCase c;
  const double scale = 0.29;
  const int64_t D = c.P + c.R;
  // Chunked prefill: sequence 0 queries its last 2 positions, sequence 1 its last 4 (its first 5 are context).
  const std::vector<int64_t> q_lens{2, 4};
  Tensor q = Tensor::empty({6, c.H, D}, DType::f32);
  fill_normal_(q, 5, 0, 1);
  Tensor out = Tensor::empty({6, c.H, c.V}, DType::f32);
  reference::mla_attention(out, q, c.cache, c.w, Tensor::from_i32({0, 2, 6}, {3}), c.seq_lens(), c.block_tables(),
                           scale);
  const std::vector<double> qv = q.to_doubles(), w = c.w.to_doubles(), kv = c.kv_c.to_doubles(),
                            pe = c.k_pe.to_doubles(), got = out.to_doubles();
  double max_err = 0;
  int64_t row = 0;
  for (size_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < q_lens[b]; ++j, ++row) {
      const int64_t position = c.lens[b] - q_lens[b] + j;
      for (int64_t h = 0; h < c.H; ++h) {
        std::vector<double> scores;
        for (int64_t p = 0; p <= position; ++p) {
          const int64_t t = c.first_token(b) + p;
          double dot = 0;
          for (int64_t i = 0; i < c.P; ++i) {
            double k = 0;
            for (int64_t l = 0; l < c.L; ++l) k += w[size_t((h * (c.P + c.V) + i) * c.L + l)] * kv[size_t(t * c.L + l)];
            dot += qv[size_t((row * c.H + h) * D + i)] * k;
          }
          for (int64_t i = 0; i < c.R; ++i) dot += qv[size_t((row * c.H + h) * D + c.P + i)] * pe[size_t(t * c.R + i)];
          scores.push_back(scale * dot);
        }
        const double m = *std::max_element(scores.begin(), scores.end());
        double denom = 0;
        for (double& s : scores) denom += (s = std::exp(s - m));
        for (int64_t v = 0; v < c.V; ++v) {
          double acc = 0;
          for (int64_t p = 0; p <= position; ++p) {
            const int64_t t = c.first_token(b) + p;
            double val = 0;
            for (int64_t l = 0; l < c.L; ++l)
              val += w[size_t((h * (c.P + c.V) + c.P + v) * c.L + l)] * kv[size_t(t * c.L + l)];
            acc += scores[size_t(p)] * val;
          }
          max_err = std::max(max_err, std::abs(acc / denom - got[size_t((row * c.H + h) * c.V + v)]));
        }
      }
    }
  EXPECT_LT(max_err, 2e-6);
}

}  // namespace

namespace {

using namespace kbn;

// ---- grouped_topk (DeepSeek's routers) ----

struct Routed {
  std::vector<int64_t> ids;
  std::vector<double> weights;
};

Routed route(const std::vector<float>& logits, int64_t experts, int64_t k, bool renormalize, int64_t groups,
             int64_t topk_group, const std::string& scoring, double scale, const std::vector<float>& bias = {}) {
  const int64_t n = int64_t(logits.size()) / experts;
  Tensor w = Tensor::empty({n, k}, DType::f32), ids = Tensor::empty({n, k}, DType::i32);
  reference::grouped_topk(w, ids, Tensor::from_floats(logits, {n, experts}), renormalize, groups, topk_group, scoring,
                          scale, bias.empty() ? Tensor() : Tensor::from_floats(bias, {experts}));
  return {ids.to_ints(), w.to_doubles()};
}

TEST(GroupedTopk, OneGroupIsTopkSoftmax) {
  // V2-Lite's router (greedy: one group) is the plain softmax top-k, with and without renormalisation.
  Tensor logits = Tensor::empty({5, 16}, DType::f32);
  fill_normal_(logits, 11, 0, 2);
  for (bool renormalize : {false, true}) {
    Tensor w = Tensor::empty({5, 6}, DType::f32), ids = Tensor::empty({5, 6}, DType::i32);
    reference::topk_softmax(w, ids, logits, renormalize);
    Tensor gw = Tensor::empty({5, 6}, DType::f32), gids = Tensor::empty({5, 6}, DType::i32);
    reference::grouped_topk(gw, gids, logits, renormalize, 1, 1, "softmax", 1.0, Tensor());
    EXPECT_EQ(gids.to_ints(), ids.to_ints());
    const std::vector<double> a = gw.to_doubles(), b = w.to_doubles();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-7);
  }
}

TEST(GroupedTopk, GroupsLimitTheChoiceAndTheBiasOnlyChooses) {
  // 8 experts in 4 groups of 2, keep 2 groups, top 2, sigmoid scores s(x) of the logits:
  //   expert:  0     1     2     3     4     5     6     7
  //   logit:   3.0  -4.0   1.0   1.0   2.0  -4.0  -1.0  -1.0
  // Without a bias a group scores its best: s(3), s(1), s(2), s(-1): groups 0 and 2 are kept, the top 2 are 0 and 4.
  const std::vector<float> logits{3.0f, -4.0f, 1.0f, 1.0f, 2.0f, -4.0f, -1.0f, -1.0f};
  const auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  Routed r = route(logits, 8, 2, false, 4, 2, "sigmoid", 1.0);
  EXPECT_EQ(r.ids, (std::vector<int64_t>{0, 4}));
  EXPECT_NEAR(r.weights[0], sig(3.0), 1e-7);
  EXPECT_NEAR(r.weights[1], sig(2.0), 1e-7);
  // With a (zero) bias a group scores the sum of its two best: group 1 (2 s(1) = 1.46) and group 0 (s(3) + s(-4) =
  // 0.97) beat group 2 (0.90) and group 3 (0.54): the top 2 of experts 0-3 are 0, then 2 (a tie with 3: lower index).
  r = route(logits, 8, 2, false, 4, 2, "sigmoid", 1.0, std::vector<float>(8, 0.f));
  EXPECT_EQ(r.ids, (std::vector<int64_t>{0, 2}));
  // A bias moves the choice but not the weights: +0.5 on expert 3 puts it first (s(1) + 0.5 = 1.23 > s(3) = 0.95),
  // weighted by its unbiased s(1).
  std::vector<float> bias(8, 0.f);
  bias[3] = 0.5f;
  r = route(logits, 8, 2, true, 4, 2, "sigmoid", 2.5, bias);
  EXPECT_EQ(r.ids, (std::vector<int64_t>{3, 0}));
  const double sum = sig(1.0) + sig(3.0);
  EXPECT_NEAR(r.weights[0], 2.5 * sig(1.0) / sum, 1e-6);  // renormalised over the unbiased scores, then scaled
  EXPECT_NEAR(r.weights[1], 2.5 * sig(3.0) / sum, 1e-6);
}

TEST(GroupedTopk, BadArgumentsAreNamed) {
  const std::vector<float> logits(12, 0.f);
  const auto message = [&](int64_t k, int64_t groups, int64_t topk_group, const std::string& scoring,
                           const std::vector<float>& bias) {
    try {
      route(logits, 12, k, false, groups, topk_group, scoring, 1.0, bias);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(2, 5, 1, "softmax", {}).find("'num_expert_group' (5) must divide num_experts (12"),
            std::string::npos);
  EXPECT_NE(message(2, 4, 5, "softmax", {}).find("'topk_group' (5) must be in [1, num_expert_group = 4]"),
            std::string::npos);
  EXPECT_NE(message(4, 4, 1, "softmax", {}).find("top_k (4, topk_ids' last dimension) must be in [1, 3]"),
            std::string::npos);
  EXPECT_NE(message(2, 4, 1, "relu", {}).find("'scoring_func' must be softmax or sigmoid"), std::string::npos);
  EXPECT_NE(message(1, 12, 1, "sigmoid", std::vector<float>(12, 0.f)).find("scored by its two best experts"),
            std::string::npos);
  std::vector<float> nan_logits(12, 0.f);
  nan_logits[5] = std::numeric_limits<float>::quiet_NaN();
  Tensor w = Tensor::empty({1, 2}, DType::f32), ids = Tensor::empty({1, 2}, DType::i32);
  EXPECT_THROW(
      reference::grouped_topk(w, ids, Tensor::from_floats(nan_logits, {1, 12}), false, 4, 2, "softmax", 1.0, Tensor()),
      Error);
}

TEST(DeepseekV2MoE, TheRouterRanksF32LogitsThatBf16WouldTie) {
  // tiny-deepseek-v3: 8 experts in 4 groups of 2, 2 groups kept, top 2, sigmoid scores, score-correction bias (zero).
  // Hidden [1, 1, 0, ...] and gate rows [1, d_j, 0, ...] give experts 0, 2, 4 the logits 1 + 2^-10, 1 + 2^-9 and
  // 1 + 3 * 2^-10, all 1.0 when rounded to bf16, and the others -4. In f32 expert 4 leads, then 2 (their groups are
  // kept); rounded to bf16 the three tie and the lower ids, 0 and 2, would win.
  const engine::ModelSpec spec = engine::resolve_model("tiny-deepseek-v3");
  const DeepseekV2Config c = DeepseekV2Config::from(spec.config);
  baseline::DeepseekV2MoE moe(c, "model.layers.1.mlp", {DType::bf16, Device::cpu()});
  init_random_weights(moe, 3, 1.0);
  const int64_t H = c.hidden_size, E = c.n_routed_experts;
  ASSERT_EQ(E, 8);
  std::vector<float> gate(size_t(E * H), 0.f);
  const double d[8] = {0x1p-10, 0, 0x1p-9, 0, 3 * 0x1p-10, 0, 0, 0};
  for (int64_t j = 0; j < E; ++j) {
    const bool near = j == 0 || j == 2 || j == 4;
    gate[size_t(j * H)] = near ? 1.f : -4.f;
    gate[size_t(j * H + 1)] = float(d[j]);
  }
  moe.gate_weight.copy_(Tensor::from_floats(gate, {E, H}, DType::bf16));
  std::vector<float> xv(size_t(2 * H), 0.f);
  xv[0] = xv[1] = xv[size_t(H)] = xv[size_t(H + 1)] = 1.f;  // two identical tokens
  const Tensor x = Tensor::from_floats(xv, {2, H}, DType::bf16);

  const Tensor logits = baseline::RouterGemm().forward(x, moe.gate_weight);
  ASSERT_EQ(logits.dtype(), DType::f32);
  EXPECT_EQ(logits.to_doubles()[4], 1 + 3 * 0x1p-10);

  // The expected output: experts 4 and 2 weighted by their renormalised sigmoids times routed_scaling_factor, plus the
  // shared expert.
  const auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  const double s4 = sig(1 + 3 * 0x1p-10), s2 = sig(1 + 0x1p-9);
  const float w4 = float(c.routed_scaling_factor * s4 / (s4 + s2)),
              w2 = float(c.routed_scaling_factor * s2 / (s4 + s2));
  const auto routed = [&](int32_t a, int32_t b) {
    return moe.experts
        .forward_routed(x, Tensor::from_floats({w4, w2, w4, w2}, {2, 2}), Tensor::from_i32({a, b, a, b}, {2, 2}))
        .to_doubles();
  };
  const std::vector<double> r = routed(4, 2), tied = routed(0, 2), sh = moe.shared_experts->forward(x).to_doubles(),
                            out = moe.forward(x).to_doubles();
  ASSERT_EQ(out.size(), r.size());
  double apart = 0;  // how far the bf16 tie's choice would land: the check below can tell the two apart
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], r[i] + sh[i], 2e-2 * (1 + std::abs(r[i] + sh[i]))) << i;
    apart = std::max(apart, std::abs(tied[i] - r[i]) / (1 + std::abs(r[i] + sh[i])));
  }
  EXPECT_GT(apart, 0.1);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

// MLA rotates q's rope part in place through a [T, heads, rope] view with q's head stride: the same values as rotating
// a packed copy and writing it back (what the layer did before), the nope features untouched; a 3-D operand whose
// last dimension is not head_size is refused by name.
TEST(MlaRotary, HeadStridedViewEqualsThePackedCopy) {
  const int64_t T = 3, H = 4, nope = 8, rope = 6, D = nope + rope;
  baseline::RotaryEmbedding rotary(rope, rope, 64, 10000.0, false, {});
  Tensor q = Tensor::empty({T, H * D}, DType::bf16), k = Tensor::empty({T, 2 * rope}, DType::bf16);
  fill_normal_(q, 31, 0.0, 1.0);
  fill_normal_(k, 32, 0.0, 1.0);
  const Tensor positions = Tensor::from_i64({5, 17, 40}, {T});
  Tensor q_packed = q.view({T, H, D}).slice(2, nope, D).contiguous().view({T, H * rope});
  Tensor k_packed = k.slice(1, rope, 2 * rope).contiguous();
  rotary.forward(positions, q_packed, k_packed);
  Tensor q2 = q.clone(), k2 = k.clone();
  rotary.forward(positions, q2.view({T, H, D}).slice(2, nope, D), k2.slice(1, rope, 2 * rope));
  EXPECT_EQ(q2.view({T, H, D}).slice(2, nope, D).contiguous().to_doubles(), q_packed.to_doubles());
  EXPECT_EQ(q2.view({T, H, D}).slice(2, 0, nope).contiguous().to_doubles(),
            q.view({T, H, D}).slice(2, 0, nope).contiguous().to_doubles());
  EXPECT_EQ(k2.slice(1, rope, 2 * rope).contiguous().to_doubles(), k_packed.to_doubles());
  EXPECT_EQ(k2.slice(1, 0, rope).contiguous().to_doubles(), k.slice(1, 0, rope).contiguous().to_doubles());
  const std::string err = error_of([&] { rotary.forward(positions, q.view({T, H, D}), k2.slice(1, rope, 2 * rope)); });
  EXPECT_NE(err.find("'query'"), std::string::npos) << err;
  EXPECT_NE(err.find("head_size"), std::string::npos) << err;
}

// fused_mla_rope_cache on the CPU: the values of the four ops it replaces (the latent's RMSNorm, the rope on q's rope
// part and on k_pe, concat_and_cache_mla, the decode tokens' q_pe into q_abs's tail), kv_a untouched, q's nope part,
// the latent part of q_abs and the padding token's slot untouched; bad arguments named.
TEST(FusedMlaRopeCache, ValuesOfTheFourOpsAndBadArgumentsNamed) {
  const int64_t T = 4, H = 3, P = 4, R = 6, L = 8, W = L + R, D = P + R, nd = 2;
  const auto rnd = [](const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::f32);
    fill_normal_(t, seed, 0.0, 1.0);
    return t;
  };
  const Tensor kv_a = rnd({T, W + 2}, 41).slice(1, 0, W), q0 = rnd({T, H, D}, 42), weight = rnd({L}, 43);
  const Tensor q_abs0 = rnd({nd, H, W}, 44), cache0 = rnd({2, 4, W}, 45);
  const Tensor positions = Tensor::from_i64({3, 0, 9, 31}, {T}), slots = Tensor::from_i64({5, -1, 0, 7}, {T});
  baseline::RotaryEmbedding rope(R, R, 32, 10000.0, false, {});
  Tensor q = q0.clone(), q_abs = q_abs0.clone(), cache = cache0.clone();
  const std::vector<double> kv_a_before = kv_a.contiguous().to_doubles();
  baseline::FusedMlaRopeCache op(H, P, R, L, 1e-6);
  op.forward(kv_a, q, positions, rope.cos_sin_cache, weight, cache, slots, q_abs);

  baseline::RMSNorm norm(L, 1e-6);
  norm.weight = weight;
  const Tensor normed = norm.forward(kv_a.slice(1, 0, L).contiguous());
  Tensor q2 = q0.clone(), k_pe = kv_a.slice(1, L, W).contiguous(), cache2 = cache0.clone(), q_abs2 = q_abs0.clone();
  rope.forward(positions, q2.slice(2, P, D), k_pe);
  baseline::ConcatAndCacheMLA().forward(normed, k_pe, cache2, slots);
  q_abs2.slice(2, L, W).copy_(q2.slice(0, T - nd, T).slice(2, P, D));
  EXPECT_EQ(q.to_doubles(), q2.to_doubles());
  EXPECT_EQ(cache.to_doubles(), cache2.to_doubles());
  EXPECT_EQ(q_abs.to_doubles(), q_abs2.to_doubles());
  EXPECT_EQ(kv_a.contiguous().to_doubles(), kv_a_before);
  EXPECT_NE(q.to_doubles(), q0.to_doubles());  // something rotated
  // Without q_abs: the same q and cache.
  Tensor q3 = q0.clone(), cache3 = cache0.clone();
  op.forward(kv_a, q3, positions, rope.cos_sin_cache, weight, cache3, slots);
  EXPECT_EQ(q3.to_doubles(), q2.to_doubles());
  EXPECT_EQ(cache3.to_doubles(), cache2.to_doubles());
  // One token, whose k_pe slice is contiguous already: kv_a is still left untouched.
  const Tensor kv_a1 = rnd({1, W}, 46);
  const std::vector<double> kv_a1_before = kv_a1.to_doubles();
  Tensor q1 = q0.slice(0, 0, 1).clone(), cache1 = cache0.clone();
  op.forward(kv_a1, q1, positions.slice(0, 0, 1), rope.cos_sin_cache, weight, cache1, slots.slice(0, 0, 1));
  EXPECT_EQ(kv_a1.to_doubles(), kv_a1_before);

  const auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "expected \"" << part << "\" in: " << msg;
  };
  const Tensor table = rope.cos_sin_cache;
  has(error_of([&] { op.forward(rnd({T, W + 1}, 1), q, positions, table, weight, cache, slots); }), "'kv_a'");
  has(error_of([&] { op.forward(kv_a, rnd({T, H + 1, D}, 1), positions, table, weight, cache, slots); }), "num_heads");
  has(error_of([&] { op.forward(kv_a, q, Tensor::from_i64({1, 2}, {2}), table, weight, cache, slots); }),
      "'positions'");
  has(error_of([&] { op.forward(kv_a, q, positions, rnd({32, 4}, 1), weight, cache, slots); }), "'cos_sin_cache'");
  has(error_of([&] { op.forward(kv_a, q, positions, table, rnd({L + 1}, 1), cache, slots); }), "'norm_weight'");
  has(error_of([&] { op.forward(kv_a, q, positions, table, weight, rnd({2, 4, W - 1}, 1), slots); }), "'kv_cache'");
  has(error_of([&] { op.forward(kv_a, q, positions, table, weight, cache, Tensor::from_i32({0, 1, 2, 3}, {T})); }),
      "'slot_mapping'");
  has(error_of([&] { op.forward(kv_a, q, positions, table, weight, cache, slots, rnd({T + 1, H, W}, 1)); }), "'q_abs'");
  has(error_of([&] { op.forward(kv_a, q, positions, table, weight.to(DType::bf16), cache, slots); }), "'norm_weight'");
  has(error_of([] { baseline::FusedMlaRopeCache(3, 4, 5, 8, 1e-6); }), "'qk_rope_head_dim'");
  has(error_of([] { baseline::FusedMlaRopeCache(0, 4, 6, 8, 1e-6); }), "'num_heads'");
  EXPECT_TRUE(baseline::FusedMlaRopeCache::kernel_supports(DType::bf16, 512, 64));
  EXPECT_FALSE(baseline::FusedMlaRopeCache::kernel_supports(DType::bf16, 4096, 64));  // 512 vectors: > 256
  EXPECT_FALSE(baseline::FusedMlaRopeCache::kernel_supports(DType::bf16, 12, 6));     // not whole vectors
}

TEST(MlaDecode, BadArgumentsAreNamed) {
  baseline::MlaDecode op(4, 32, 8, 0.1);
  const Tensor cache = Tensor::zeros({3, 4, 40}, DType::f32), tables = Tensor::from_i32({0, 1, 2}, {1, 3});
  const Tensor lens = Tensor::from_i32({5}, {1}), q = Tensor::zeros({1, 4, 40}, DType::f32);
  const auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "expected \"" << part << "\" in: " << msg;
  };
  has(error_of([&] { op.forward(Tensor::zeros({1, 4, 39}, DType::f32), cache, lens, tables, 5); }), "'q'");
  has(error_of([&] { op.forward(Tensor::zeros({1, 3, 40}, DType::f32), cache, lens, tables, 5); }), "num_heads");
  has(error_of([&] { op.forward(q, Tensor::zeros({3, 4, 40}, DType::bf16), lens, tables, 5); }), "'kv_cache'");
  has(error_of([&] { op.forward(q, cache, Tensor::from_i64({5}, {1}), tables, 5); }), "'seq_lens'");
  has(error_of([&] { op.forward(q, cache, lens, Tensor::from_i32({0, 1, 2, 0, 1, 2}, {2, 3}), 5); }), "'block_tables'");
  has(error_of([&] { op.forward(q, cache, lens, tables, -1); }), "'max_seq_len'");
  has(error_of([] { baseline::MlaDecode(0, 32, 8, 0.1); }), "'num_heads'");
  has(error_of([] { baseline::MlaDecode(4, 32, 8, -1.0); }), "'scale'");
  EXPECT_EQ(error_of([&] { op.forward(q, cache, lens, tables, 5); }), "accepted");
}

TEST(GatherCache, RowsInPositionOrderZerosPastTheEndAndBadArgumentsNamed) {
  // Two sequences over a cache of 4 blocks of 2 rows (row value = 10 * block + row): sequence 0 holds 3 rows in blocks
  // 2 then 0, sequence 1 one row in block 3.
  std::vector<float> rows;
  for (int b = 0; b < 4; ++b)
    for (int r = 0; r < 2; ++r) rows.insert(rows.end(), {float(10 * b + r), float(10 * b + r) + 0.5f});
  const Tensor cache = Tensor::from_floats(rows, {4, 2, 2});
  const Tensor tables = Tensor::from_i32({2, 0, 3, 1}, {2, 2}), lens = Tensor::from_i32({3, 1}, {2});
  baseline::GatherCache op;
  const std::vector<float> got = op.forward(cache, tables, lens, 4).to_floats();
  const std::vector<float> want{20, 20.5, 21, 21.5, 0, 0.5, 0, 0, 30, 30.5, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(got, want);
  EXPECT_NE(error_of([&] { op.forward(cache, tables, lens, 2); }).find("'seq_lens'[0] = 3"), std::string::npos);
  EXPECT_NE(error_of([&] {
              op.forward(cache, Tensor::from_i32({2, 9, 3, 1}, {2, 2}), lens, 4);
            }).find("'block_tables'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { op.forward(cache, tables, Tensor::from_i32({3}, {1}), 4); }).find("'block_tables'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { op.forward(cache, tables, lens, -1); }).find("'max_seq_len'"), std::string::npos);
}

// The absorbed weights exist only after process_weights_after_loading, and a forward without them says so; the model
// serves its cache specs as latent rows (one 40-wide row per token per layer for the tiny config).
TEST(RouterGemm, F32LogitsOfTheOracleAndBadArgumentsNamed) {
  // bf16 operands whose exact products sum to a value between two bf16 numbers: the logit stays unrounded.
  const Tensor x = Tensor::from_floats({1.f, 1.f}, {1, 2}, DType::bf16);
  const Tensor w = Tensor::from_floats({1.f, float(0x1p-10), -2.f, 0.5f}, {2, 2}, DType::bf16);
  const Tensor logits = baseline::RouterGemm().forward(x, w);
  ASSERT_EQ(logits.dtype(), DType::f32);
  EXPECT_EQ(logits.to_doubles(), (std::vector<double>{1 + 0x1p-10, -1.5}));
  const auto message = [](const Tensor& a, const Tensor& b) {
    return error_of([&] { baseline::RouterGemm().forward(a, b); });
  };
  EXPECT_NE(message(Tensor::zeros({2}, DType::bf16), w).find("router_gemm: argument 'x'"), std::string::npos);
  EXPECT_NE(message(x, Tensor::zeros({2, 2}, DType::f16)).find("'weight'"), std::string::npos);
  EXPECT_NE(message(x, Tensor::zeros({2, 3}, DType::bf16)).find("hidden"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 2}, DType::i32), w).find("'x'"), std::string::npos);
}

TEST(DeepseekV2Model, LatentCacheSpecsAndAbsorbedWeightsAfterLoading) {
  const engine::ModelSpec spec = engine::resolve_model("tiny-deepseek-v2");
  baseline::DeepseekV2ForCausalLM model(spec.config, {DType::f32, Device::cpu()});
  const std::vector<LayerCacheSpec> specs = model.cache_specs();
  ASSERT_EQ(specs.size(), 3u);
  for (const auto& c : specs) {
    EXPECT_EQ(c.kind, LayerCacheSpec::Kind::paged_latent);
    EXPECT_EQ(c.latent_size, 40);
    EXPECT_EQ(c.bytes_per_token(), 40 * 4);
  }
  auto& attn = model.model.layers[0]->self_attn;
  EXPECT_NE(error_of([&] {
              attn.forward(Tensor::from_i64({0}, {1}), Tensor::zeros({1, 64}, DType::f32));
            }).find("process_weights_after_loading"),
            std::string::npos);
  init_random_weights(model, 1, 0.1);
  model.process_weights_after_loading_recursive();
  // W_UK_T[h] is head h's key rows of kv_b_proj transposed; W_UV[h] its value rows.
  const Tensor w = attn.kv_b_proj.weight;
  ASSERT_EQ(attn.W_UK_T.shape(), (Shape{4, 32, 16}));
  ASSERT_EQ(attn.W_UV.shape(), (Shape{4, 16, 32}));
  const std::vector<float> wf = w.to_floats(), uk = attn.W_UK_T.to_floats(), uv = attn.W_UV.to_floats();
  for (int h = 0; h < 4; ++h)
    for (int l = 0; l < 32; ++l)
      for (int p = 0; p < 16; ++p) {
        EXPECT_EQ(uk[size_t((h * 32 + l) * 16 + p)], wf[size_t((h * 32 + p) * 32 + l)]);
        EXPECT_EQ(uv[size_t((h * 16 + p) * 32 + l)], wf[size_t((h * 32 + 16 + p) * 32 + l)]);
      }
}

}  // namespace
