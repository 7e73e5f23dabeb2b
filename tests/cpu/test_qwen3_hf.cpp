// Qwen3 dense against Hugging Face transformers' Qwen3ForCausalLM (tests/hf_fixture.h): the tiny config has tied
// embeddings, head_dim 32 with 4 heads over hidden 64 (q/k projections wider than the hidden size), GQA 4/2,
// peaked weights (initializer_range 0.08) and per-head q/k norms drawn U(0.5, 1.5), so a norm applied over the
// wrong axis, before the wrong projection or after rotary moves the logits far past the tolerance.
#include <gtest/gtest.h>

#include "engine/model_loader.h"
#include "hf_fixture.h"
#include "kbn/error.h"

using namespace kbn;

TEST(Qwen3VsHF, TinyTiedEmbeddingsLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-qwen3"); }

TEST(Qwen3Config, SlidingWindowIsRefusedNamingTheKey) {
  engine::ModelSpec spec = engine::resolve_model("tiny-qwen3");
  std::string j = spec.config.dump();
  j.replace(j.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  engine::ModelSpec bad = spec;
  bad.config = ModelConfig::parse(j, "tiny-qwen3 with windows");
  try {
    engine::build_model(bad, Variant::baseline, {DType::f32, Device::cpu()}, 0);
    FAIL() << "a sliding-window Qwen3 config was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_sliding_window"), std::string::npos) << e.what();
  }
}
