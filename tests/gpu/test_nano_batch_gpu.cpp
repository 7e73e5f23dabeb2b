// Overlapped nano-batches on the GPU (engine/nano_batch.h): every eager step of two or more sequences split into 2
// or 3 nano-batches, each the whole model on a stream of its own, gives the greedy tokens of whole steps, in eager
// mode and in graph mode (where decode-only steps replay graphs and the rest split), with chunked prefill and
// preemption, for a paged-KV model (tiny Llama, f32), MoE with sliding windows and sinks (tiny gpt-oss), MLA's latent
// cache (tiny DeepSeek-V2, whose prefill shares a block-id table across streams) and recurrent state (tiny Mamba-2).
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

// `n` greedy requests of 1..max_prompt prompt tokens and 3..31 output tokens.
std::vector<Request> requests(int64_t n, int64_t max_prompt, int64_t vocab) {
  std::vector<Request> reqs;
  for (int64_t i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    const int64_t len = 1 + (i * 7) % max_prompt;
    for (int64_t j = 0; j < len; ++j) r.prompt.push_back((i * 97 + j * 31 + 5) % vocab);
    r.sampling.max_tokens = 3 + (i * 5) % 29;
    r.sampling.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct Outcome {
  std::vector<std::vector<int64_t>> tokens;
  int64_t nano_steps = 0, graph_steps = 0, preemptions = 0;
};

Outcome run(CausalLM& model, EngineConfig cfg, ExecutionMode mode, int nano, const std::vector<Request>& reqs) {
  cfg.mode = mode;
  cfg.nano_batching = {nano, 1};
  LLMEngine engine(model, Variant::baseline, Device::cuda(0), cfg);
  const RunResult r = engine.run_to_completion(reqs);
  Outcome out;
  for (const auto& o : r.outputs) out.tokens.push_back(o.tokens);
  out.nano_steps = engine.runner().num_nano_batched_steps();
  out.graph_steps = engine.runner().num_graph_steps();
  out.preemptions = r.preemptions;
  return out;
}

}  // namespace

class NanoBatchGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(NanoBatchGpu, SplitStepsGiveTheTokensOfWholeSteps) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/" + GetParam());
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = requests(13, 40, model->vocab_size());
  EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.num_kv_blocks = 512;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 24;  // prefills in chunks, sharing steps with decodes
  EngineConfig tight = cfg;
  tight.block_size = 4;
  tight.num_kv_blocks = 40 * int64_t(kv_cache_groups(model->cache_specs()).windows.size());
  if (has_state_layers(model->cache_specs())) tight.num_state_slots = 4;
  for (const auto& [name, config] : {std::pair<const char*, EngineConfig>{"chunked", cfg}, {"tight pool", tight}}) {
    SCOPED_TRACE(name);
    const Outcome whole = run(*model, config, ExecutionMode::eager, 1, reqs);
    for (const int nano : {2, 3}) {
      for (const ExecutionMode mode : {ExecutionMode::eager, ExecutionMode::graph}) {
        SCOPED_TRACE(std::to_string(nano) + " nano-batches, " + execution_mode_name(mode));
        const Outcome split = run(*model, config, mode, nano, reqs);
        EXPECT_GT(split.nano_steps, 0);
        if (mode == ExecutionMode::graph) {
          EXPECT_GT(split.graph_steps, 0);
        }
        ASSERT_EQ(split.tokens.size(), reqs.size());
        for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(split.tokens[i], whole.tokens[i]) << "request " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, NanoBatchGpu,
                         ::testing::Values("tiny-llama", "tiny-gpt-oss", "tiny-deepseek-v2", "tiny-mamba2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });
