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

namespace {

using namespace kbn;

TEST(DeepseekV2VsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-deepseek-v2"); }

TEST(DeepseekV2VsHF, ChunkedPrefillAcrossStepsGivesTheGreedyTokens) {
  test::HfFixture fx = test::load_hf_fixture("tiny-deepseek-v2");
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;  // every prompt longer than 5 tokens is split over steps
  cfg.max_num_seqs = 4;
  cfg.num_kv_blocks = 512;
  engine::LLMEngine eng(*model, Variant::baseline, Device::cpu(), cfg);
  std::vector<engine::Request> rs;
  for (int rep = 0; rep < 2; ++rep)
    for (const auto& p : fx.expected["prompts"]) {
      engine::Request r;
      r.id = int64_t(rs.size());
      r.prompt = p["prompt_ids"].get<std::vector<int64_t>>();
      r.sampling.max_tokens = int64_t(p["greedy_ids"].size());
      rs.push_back(r);
    }
  const engine::RunResult res = eng.run_to_completion(rs);
  ASSERT_EQ(res.outputs.size(), rs.size());
  const size_t n = fx.expected["prompts"].size();
  for (size_t i = 0; i < rs.size(); ++i)
    EXPECT_EQ(res.outputs[i].tokens, fx.expected["prompts"][i % n]["greedy_ids"].get<std::vector<int64_t>>())
        << "request " << i;
  eng.scheduler().check_invariants();
}

}  // namespace
