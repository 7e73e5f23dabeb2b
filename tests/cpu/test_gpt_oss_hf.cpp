// gpt-oss against Hugging Face transformers' GptOssForCausalLM (tests/hf_fixture.h; fixture made on the H200 by
// tools/hf_reference.py --config models/tiny-gpt-oss.json --hidden-states, transformers 5.17). The tiny config has
// a sliding window of 8 on layers 0 and 2 and full attention on layer 1, attention sinks drawn from N(0, 1) (so they
// take a visible share of each softmax), q/k/v/o biases, YaRN (factor 8 over 128 positions, truncate false), and 8
// experts of 48 per layer, 4 per token, with gpt-oss's router (softmax over the chosen logits, router bias),
// interleaved gate/up columns, expert biases and the swigluoai activation. Prompts of 11 and 23 tokens and 16 greedy
// tokens cross the window. Then the engine: prompts split over steps by chunked prefill; config errors.
//
// NOTE: transformers 5.17's GptOssExperts clamps at a fixed 7.0 and ignores config.swiglu_limit; the fixture's
// activations stay far inside it, so the clamp is checked by the oracle tests (test_gemma_gpt_oss_ops.cpp, the GPU
// fused_experts tests), not here.
#include <gtest/gtest.h>

#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "hf_fixture.h"
#include "kbn/error.h"
#include "kbn/safetensors.h"

namespace {

using namespace kbn;

void expect_in(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
}

TEST(GptOssVsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-gpt-oss"); }

TEST(GptOssVsHF, ChunkedPrefillAcrossStepsGivesTheGreedyTokens) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-gpt-oss");
  engine::EngineConfig cfg;
  cfg.max_model_len = 128;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 5;  // every prompt longer than 5 tokens is split over steps
  cfg.max_num_seqs = 4;
  cfg.num_kv_blocks = 512;
  test::check_engine_greedy(fx, cfg, 2);
}

// Config fields that the checkpoint or the model contradict are named with their values.
TEST(GptOssVsHF, BadConfigsNameTheField) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-gpt-oss");
  const auto error = [&](const std::string& overrides) { return test::build_error_with(fx, overrides); };
  expect_in(error(R"({"layer_types": ["sliding_attention", "full_attention"]})"),
            "'layer_types' lists 2 layers but 'num_hidden_layers' is 3");
  expect_in(error(R"({"layer_types": ["sliding_attention", "full_attention", "local"]})"),
            "'layer_types'[2] is \"local\"");
  expect_in(error(R"({"sliding_window": 0})"), "key 'sliding_window' must be positive (or null), got 0");
  expect_in(error(R"({"sliding_window": -4})"), "key 'sliding_window' must be positive (or null), got -4");
  expect_in(error(R"({"swiglu_limit": 0})"), "key 'swiglu_limit' must be positive, got 0");
  expect_in(error(R"({"num_experts_per_tok": 9, "experts_per_token": 9})"),
            "'num_experts_per_tok' (9) must not exceed 'num_local_experts' (8)");
  expect_in(error(R"({"experts_per_token": 2})"), "'experts_per_token' (2) and 'num_experts_per_tok' (4) disagree");
  // The checkpoint's tensors load in name order: down_proj is the first expert tensor of a layer.
  expect_in(error(R"({"num_local_experts": 4})"), "checkpoint down_proj is f32[8, 48, 64] cpu, expected [4, 48, 64]");
  expect_in(error(R"({"intermediate_size": 32})"), "checkpoint down_proj is f32[8, 48, 64] cpu, expected [8, 32, 64]");
}

// The checkpoint's own tensors, altered one at a time: a sinks vector of the wrong length and the published
// checkpoints' MXFP4 expert tensors are refused with the tensor named.
TEST(GptOssVsHF, BadCheckpointTensorsAreNamed) {
  const test::HfFixture fx = test::load_hf_fixture("tiny-gpt-oss");
  auto load_with = [&](const std::function<void(const std::string&, const Tensor&, const WeightVisitor&)>& edit) {
    auto model = engine::build_model(engine::ModelSpec{.name = fx.spec.name, .config = fx.spec.config},
                                     Variant::baseline, {DType::f32, Device::cpu()}, 0);
    Checkpoint ckpt = Checkpoint::open(fx.spec.weights_path);
    try {
      model->load_weights([&](const WeightVisitor& visit) {
        ckpt.for_each([&](const std::string& n, const Tensor& t) { edit(n, t, visit); });
      });
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "the altered checkpoint loaded";
    return std::string();
  };
  expect_in(load_with([](const std::string& n, const Tensor& t, const WeightVisitor& visit) {
              visit(n, n == "model.layers.1.self_attn.sinks" ? t.slice(0, 0, 3).contiguous() : t);
            }),
            "checkpoint sinks is f32[3] cpu, expected [4] (num_attention_heads)");
  expect_in(load_with([](const std::string& n, const Tensor& t, const WeightVisitor& visit) {
              if (n == "model.layers.0.mlp.experts.gate_up_proj")
                visit("model.layers.0.mlp.experts.gate_up_proj_blocks", t);
              else
                visit(n, t);
            }),
            "'model.layers.0.mlp.experts.gate_up_proj_blocks' is an MXFP4 expert tensor");
}

}  // namespace
