// DeepSeek-V2 / V3 groundwork (issue 18): the typed config of both published configs (models/deepseek-v2-lite.json,
// models/deepseek-v3.json), its derived quantities (latent row, MLA softmax scale under YaRN, which layers are MoE)
// and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "configs/deepseek_v2.h"
#include "engine/model_loader.h"
#include "kbn/error.h"

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

}  // namespace
