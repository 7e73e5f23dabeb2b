// DeepSeek-V2 against Hugging Face transformers' DeepseekV2ForCausalLM (tests/hf_fixture.h; fixture made on the H200
// by tools/hf_reference.py --config models/tiny-deepseek-v2.json --hidden-states, transformers 5.17). The tiny config
// has multi-head latent attention (4 heads of 16 + 8 rope, kv_lora_rank 32, v_head_dim 16, no q_lora), DeepSeek's
// YaRN (factor 4, mscale_all_dim 0.707: the softmax scale gains yarn_mscale^2), a dense first layer
// (first_k_dense_replace 1) and two MoE layers of 8 routed experts (top-3 greedy softmax, not renormalised) plus 2
// shared experts. The prompts' logits run the decompressed prefill; the greedy tokens after the first run the absorbed
// decode over the latent cache, so both paths meet transformers. Then the engine itself: prompts split over steps by
// chunked prefill (a chunk's prefill decompresses the rows earlier chunks stored) and mixed prefill/decode steps must
// give transformers' greedy tokens.
#include <gtest/gtest.h>

#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "hf_fixture.h"
#include "kbn/error.h"

namespace {

using namespace kbn;

TEST(DeepseekV2VsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-deepseek-v2"); }

// DeepSeek-V3's differences from V2 against transformers' DeepseekV3ForCausalLM (fixture made by tools/hf_reference.py
// --config models/tiny-deepseek-v3.json --hidden-states): the query through q_a_proj -> q_a_layernorm -> q_b_proj
// (q_lora_rank 24), and noaux_tc routing: sigmoid scores plus the score-correction bias (drawn from N(0, 0.1), not
// left at zero) pick 2 of 4 groups of 2 experts by their top-2 sums, then the top-2 experts of those, weighted by
// their bias-free scores renormalised and scaled by routed_scaling_factor 2.5; one shared expert.
TEST(DeepseekV3VsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-deepseek-v3"); }

TEST(DeepseekV2VsHF, ChunkedPrefillAcrossStepsGivesTheGreedyTokens) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-deepseek-v2");
  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;  // every prompt longer than 5 tokens is split over steps
  cfg.max_num_seqs = 4;
  cfg.num_kv_blocks = 512;
  test::check_engine_greedy(fx, cfg, 2);
}

// A config that disagrees with its checkpoint is named by field and value (the tiny fixture: 4 heads, nope 16 + rope
// 8, v 16, kv_lora_rank 32, 8 routed experts of 24).
TEST(DeepseekV2VsHF, AConfigThatDisagreesWithTheCheckpointNamesTheField) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-deepseek-v2");
  const auto error = [&](const std::string& overrides) { return test::build_error_with(fx, overrides); };
  const auto expect_in = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
  };
  expect_in(error(R"({"kv_lora_rank": 16})"), "'kv_lora_rank' is 16, the checkpoint's latent kv_c is 32 wide");
  expect_in(error(R"({"qk_rope_head_dim": 4})"),
            "'kv_lora_rank' + 'qk_rope_head_dim' is 32 + 4 = 36, the checkpoint's kv_a_proj_with_mqa gives 40 "
            "('qk_rope_head_dim' 8)");
  expect_in(error(R"({"n_routed_experts": 4})"),
            "'n_routed_experts' is 4, the checkpoint has expert 4 (numbered from 0)");
  expect_in(error(R"({"moe_intermediate_size": 12})"),
            "'moe_intermediate_size' is 12, the checkpoint's experts have 24");
  expect_in(error(R"({"num_attention_heads": 2})"),
            "'num_attention_heads' x 'v_head_dim' is 2 x 16 = 32, the checkpoint's o_proj reads 64");
  expect_in(error(R"({"qk_nope_head_dim": 8})"),
            "'num_attention_heads' x ('qk_nope_head_dim' + 'qk_rope_head_dim') is 4 x 16 = 64, the checkpoint's "
            "query has 96");
  expect_in(error(R"({"v_head_dim": 8})"), "'num_attention_heads' x 'v_head_dim' is 4 x 8 = 32");
}

}  // namespace
