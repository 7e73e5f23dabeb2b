// --check-finite (engine/finite_check.h): non-finite logits fail the step, naming the first layer whose output was
// not finite, found from the keys/values each layer wrote to the paged KV cache. The tiny Llama (2 layers) with one
// parameter poisoned after loading (the loader itself refuses NaN weights) stands for a layer that overflows.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "kbn/safetensors.h"
#include "test_errors.h"
#include "test_paths.h"
#include "test_process.h"

using namespace kbn;
using namespace kbn::engine;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<CausalLM> tiny_with_nan_in(const std::string& param) {
  auto model = build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-llama"), Variant::baseline,
                           {DType::f32, Device::cpu()}, 0);
  if (!param.empty()) {
    Tensor& t = *model->parameter(param).tensor;
    t.copy_(Tensor::full(t.shape(), std::numeric_limits<double>::quiet_NaN(), t.dtype()));
  }
  return model;
}

std::string generate_error(const std::string& param) {
  auto model = tiny_with_nan_in(param);
  GenerateOptions opt;
  opt.max_new_tokens = 3;
  opt.check_finite = true;
  return kbn::test::error_of(
      [&] { generate_tokens(*model, {{5, 6, 7}, {100, 3, 9, 44}}, Device::cpu(), Variant::baseline, opt); });
}

}  // namespace

TEST(CheckFinite, NamesTheFirstLayerWhoseOutputIsNotFinite) {
  const std::string err = generate_error("model.layers.0.mlp.down_proj.weight");
  EXPECT_NE(err.find("non-finite values (--check-finite): prefill: the logits are not finite"), std::string::npos)
      << err;
  EXPECT_NE(err.find("first non-finite layer output: layer 0 of 2 (model.layers.0; layer 1's keys/values"),
            std::string::npos)
      << err;
}

TEST(CheckFinite, LastLayerEmbeddingAndLmHead) {
  std::string err = generate_error("model.layers.1.mlp.down_proj.weight");
  EXPECT_NE(err.find("first non-finite layer output: layer 1 of 2 (the last) or the final norm"), std::string::npos)
      << err;
  err = generate_error("model.embed_tokens.weight");
  EXPECT_NE(err.find("first non-finite layer output: the embedding"), std::string::npos) << err;
  err = generate_error("lm_head.weight");
  EXPECT_NE(err.find("first non-finite layer output: the LM head"), std::string::npos) << err;
}

TEST(CheckFinite, OffByDefaultAndSilentOnFiniteRuns) {
  // Without the flag a poisoned model runs to the end (what --check-finite exists to catch).
  auto poisoned = tiny_with_nan_in("model.layers.0.mlp.down_proj.weight");
  GenerateOptions opt;
  opt.max_new_tokens = 3;
  EXPECT_NO_THROW(generate_tokens(*poisoned, {{5, 6, 7}}, Device::cpu(), Variant::baseline, opt));
  // With it, a healthy model gives the same tokens as without.
  auto healthy = tiny_with_nan_in("");
  const auto plain = generate_tokens(*healthy, {{5, 6, 7}}, Device::cpu(), Variant::baseline, opt).tokens;
  opt.check_finite = true;
  EXPECT_EQ(generate_tokens(*healthy, {{5, 6, 7}}, Device::cpu(), Variant::baseline, opt).tokens, plain);
}

TEST(CheckFinite, EngineStepNamesTheLayer) {
  auto model = tiny_with_nan_in("model.layers.0.self_attn.o_proj.weight");
  EngineConfig cfg;
  cfg.max_model_len = 2048;
  cfg.num_kv_blocks = 64;
  cfg.block_size = 4;
  cfg.check_finite = true;
  LLMEngine engine(*model, Variant::baseline, Device::cpu(), cfg);
  Request r;
  r.id = 0;
  r.prompt = {5, 6, 7, 8, 9};
  r.sampling.max_tokens = 3;
  r.sampling.ignore_eos = true;
  const std::string err = kbn::test::error_of([&] { engine.run_to_completion({r}); });
  EXPECT_NE(err.find("step 1 that sampled (1 sequences): the logits are not finite"), std::string::npos) << err;
  EXPECT_NE(err.find("first non-finite layer output: layer 0 of 2"), std::string::npos) << err;
}

TEST(CheckFinite, GenerateCliNamesTheLayerThatOverflows) {
  // A checkpoint whose layer 0 MLP is finite but overflows f16: its output is Inf, so layer 1's keys are NaN.
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const Checkpoint ck = Checkpoint::open(kbn::test::fixture_dir() + "/tiny-llama");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& n : ck.names()) {
    Tensor t = ck.load(n);
    if (n == "model.layers.0.mlp.up_proj.weight") t = Tensor::full(t.shape(), 100.0, t.dtype());
    if (n == "model.layers.0.mlp.down_proj.weight") t = Tensor::full(t.shape(), 60000.0, t.dtype());
    ts.emplace_back(n, t);
  }
  const fs::path dir = kbn::test::temp_dir("kbn_check_finite");
  fs::copy_file(kbn::test::fixture_dir() + "/tiny-llama/config.json", dir / "config.json");
  save_safetensors((dir / "model.safetensors").string(), ts);
  const std::string cmd = exe + " generate --device cpu --dtype f16 --max-new-tokens 3 --prompt-ids 5,6,7 --model " +
                          dir.string();
  const auto plain = kbn::test::shell(cmd);
  EXPECT_EQ(plain.code, 0) << "without --check-finite the overflow passes silently\n" << plain.output;
  const auto checked = kbn::test::shell(cmd + " --check-finite");
  EXPECT_EQ(checked.code, 1) << checked.output;
  EXPECT_NE(checked.output.find("prefill: the logits are not finite"), std::string::npos) << checked.output;
  EXPECT_NE(checked.output.find("first non-finite layer output: layer 0 of 2 (model.layers.0;"), std::string::npos)
      << checked.output;
  fs::remove_all(dir);
}
