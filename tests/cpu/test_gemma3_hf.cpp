// Gemma-3 against Hugging Face transformers' Gemma3ForCausalLM (tests/hf_fixture.h; fixture made on the H200 by
// tools/hf_reference.py --config models/tiny-gemma3.json). The tiny config puts a sliding window of 8 on layers 0 and
// 1 and full attention on layer 2, with a local rope base, linear rope scaling on the global layers,
// query_pre_attn_scalar 24 (not head_dim 32), tied embeddings and the embedding scale sqrt(hidden): prompts of 11
// and 23 tokens and 16 greedy tokens cross the window, so a window off by one, the wrong rope on either layer kind
// or the wrong attention scale moves these logits past the tolerance.
#include <gtest/gtest.h>

#include "hf_fixture.h"

TEST(Gemma3VsHF, TinySlidingAndGlobalLayersLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-gemma3"); }

#include <nlohmann/json.hpp>

#include "kbn/safetensors.h"

// The published Gemma-3 4B-27B checkpoints are Gemma3ForConditionalGeneration: the text model's config nested in
// text_config and its tensors under language_model.model.* (model.language_model.* as transformers 5 saves them),
// beside a vision tower. The same tiny fixture wrapped that way (its tensors renamed, a vision tensor added) must give
// transformers' logits and greedy tokens: the text model is served, the vision tensors are skipped.
TEST(Gemma3VsHF, TheTextModelOfAMultimodalCheckpointGivesTheSameLogits) {
  using namespace kbn;
  const test::HfFixture fx = test::load_hf_fixture("tiny-gemma3");
  nlohmann::json top;
  top["architectures"] = {"Gemma3ForConditionalGeneration"};
  top["model_type"] = "gemma3";
  top["text_config"] = nlohmann::json::parse(fx.spec.config.dump());
  top["text_config"].erase("architectures");
  top["vision_config"] = {{"hidden_size", 16}, {"model_type", "siglip_vision_model"}};
  for (const char* prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    engine::ModelSpec spec;
    spec.name = "tiny-gemma3 as Gemma3ForConditionalGeneration";
    spec.config = ModelConfig::parse(top.dump(), spec.name);
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
    Checkpoint ckpt = Checkpoint::open(fx.spec.weights_path);
    model->load_weights([&](const WeightVisitor& visit) {
      ckpt.for_each([&](const std::string& n, const Tensor& t) {
        visit(n.starts_with("model.") ? prefix + n.substr(6) : n, t);
      });
      visit("vision_tower.vision_model.embeddings.patch_embedding.weight", Tensor::zeros({16, 3, 2, 2}, DType::f32));
    });
    test::check_model_against_hf(*model, fx, spec.name);
  }
}

// Through the engine, the sliding layers' KV cache groups give their blocks before each window back to the pool:
// chunked prefills (5 tokens a step), decodes, prefix-cache hits (every prompt twice) and preemption in a pool
// too small for two full-attention sequences all give transformers' greedy tokens, and the KV cache at its fullest
// holds less than the same requests' slots in every layer. tiny-gemma3: groups of one layer (windows 0, 8, 8);
// a 23-token prompt + 16 tokens = 10 blocks of 4 per table, of which a sliding table keeps at most 4 (a 5-token
// chunk and the 7 keys before it) - 18 blocks for the sequence instead of 30.
TEST(Gemma3VsHF, SlidingLayersGiveTheirBlocksBackThroughTheEngine) {
  using namespace kbn;
  const test::HfFixture fx = test::load_hf_fixture("tiny-gemma3");
  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;
  cfg.max_num_seqs = 4;
  cfg.num_kv_blocks = 512;
  const engine::RunResult roomy = test::check_engine_greedy(fx, cfg, 2);
  EXPECT_GT(roomy.cached_tokens, 0);
  EXPECT_GT(roomy.kv_peak.blocks, 0);
  EXPECT_LT(roomy.kv_peak.bytes, roomy.kv_peak.full_bytes);
  // 18 blocks admit the longest request alone (max_blocks_held); a pool of three layers per block would need 30.
  cfg.num_kv_blocks = 18;
  const engine::RunResult tight = test::check_engine_greedy(fx, cfg, 2);
  EXPECT_GT(tight.preemptions, 0);
  EXPECT_LE(tight.kv_peak.blocks, 18);
  cfg.num_kv_blocks = 17;
  auto model = engine::build_model(fx.spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::LLMEngine small(*model, Variant::baseline, Device::cpu(), cfg);
  engine::Request r;
  r.id = 0;
  r.prompt = fx.expected["prompts"][3]["prompt_ids"].get<std::vector<int64_t>>();
  r.sampling.max_tokens = 16;
  try {
    small.add_request(r);
    FAIL() << "a request needing 18 blocks was admitted to a pool of 17";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need 18 KV blocks of 4 tokens but the cache has 17"), std::string::npos)
        << e.what();
  }
}
