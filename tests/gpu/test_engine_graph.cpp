// CUDA graphs in the engine. Graph mode (decode-only steps replayed from graphs captured at start-up, padded up
// to the next captured batch size) gives exactly the greedy tokens of eager mode on the tiny Llama in f32 (the
// generic attention kernel), through whole and chunked prefills, mixed steps and preemption; and a replay on
// the tensor-core split-KV decode kernel (bf16, head size 64, partitions chosen for max_model_len) agrees with
// an eager decode of the same step. Overlapped nano-batches, in both modes, give the tokens of whole steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

// `n` greedy requests with prompts of 1..max_prompt tokens and 3..31 output tokens: every request is admitted
// at once (n <= max_num_seqs), so the decode batches shrink from n to 1 as requests finish, and most of them
// (13, 11, 7, 5, 3, ...) need padding up to a captured size.
std::vector<Request> mixed_requests(int64_t n, int64_t max_prompt, int64_t vocab) {
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

struct EngineRun {
  std::vector<std::vector<int64_t>> tokens;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t graph_steps = 0;
  int64_t nano_steps = 0;  // steps run as overlapped nano-batches (EngineConfig::nano_batching)
  std::vector<int64_t> graph_sizes;
};

EngineRun run_engine(CausalLM& model, EngineConfig cfg, ExecutionMode mode, const std::vector<Request>& reqs) {
  cfg.mode = mode;
  LLMEngine engine(model, Variant::baseline, Device::cuda(0), cfg);
  const RunResult r = engine.run_to_completion(reqs);
  EngineRun out;
  for (const auto& o : r.outputs) out.tokens.push_back(o.tokens);
  out.steps = r.steps;
  out.preemptions = r.preemptions;
  out.graph_steps = engine.runner().num_graph_steps();
  out.nano_steps = engine.runner().num_nano_batched_steps();
  if (const CudaGraphRunner* g = engine.runner().cuda_graphs()) out.graph_sizes = g->sizes();
  return out;
}

// A two-layer Llama in bf16 with head size 64 (the tiny Llama widened), random weights of `seed`, on cuda:0: the
// tensor-core decode kernel, which splits the keys.
std::unique_ptr<CausalLM> bf16_head64_llama(uint64_t seed) {
  std::ifstream f(kbn::test::fixture_dir() + "/tiny-llama/config.json");
  nlohmann::json config = nlohmann::json::parse(f);
  config["hidden_size"] = 256;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["head_dim"] = 64;
  config["intermediate_size"] = 512;
  config["max_position_embeddings"] = 4096;
  config["dtype"] = "bfloat16";
  const std::string path = ::testing::TempDir() + "/kbn_graph_bf16_llama.json";
  std::ofstream(path) << config.dump(2);
  auto model = build_model(resolve_model(path), Variant::baseline, {DType::bf16, Device::cuda(0)}, seed);
  std::filesystem::remove(path);
  return model;
}

}  // namespace

TEST(EngineGraphGpu, TinyLlamaGraphModeGivesTheEagerTokens) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto model = build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-llama"), Variant::baseline,
                           {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = mixed_requests(13, 40, model->vocab_size());

  struct Case {
    const char* name;
    EngineConfig config;
    bool preempts = false;
  };
  EngineConfig whole;
  whole.max_model_len = 256;
  whole.num_kv_blocks = 512;
  whole.max_num_seqs = 16;  // captured sizes 1, 2, 4, 8, 16
  EngineConfig chunked = whole;
  chunked.max_num_batched_tokens = 24;  // prefills in chunks, sharing steps with decodes
  EngineConfig preempting = whole;
  preempting.block_size = 4;
  preempting.num_kv_blocks = 40;  // about a third of what the 13 sequences grow to

  for (const Case& c :
       {Case{"whole prefills", whole}, Case{"chunked prefills", chunked}, Case{"preemption", preempting, true}}) {
    SCOPED_TRACE(c.name);
    const EngineRun eager = run_engine(*model, c.config, ExecutionMode::eager, reqs);
    const EngineRun graph = run_engine(*model, c.config, ExecutionMode::graph, reqs);
    EXPECT_EQ(graph.graph_sizes, (std::vector<int64_t>{1, 2, 4, 8, 16}));
    EXPECT_EQ(eager.graph_steps, 0);
    EXPECT_GT(graph.graph_steps, 0);
    EXPECT_LT(graph.graph_steps, graph.steps);  // prefill steps stay eager
    EXPECT_EQ(graph.steps, eager.steps);
    if (c.preempts) {
      EXPECT_GT(graph.preemptions, 0);
    }
    ASSERT_EQ(graph.tokens.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(int64_t(graph.tokens[i].size()), reqs[i].sampling.max_tokens) << "request " << i;
      EXPECT_EQ(graph.tokens[i], eager.tokens[i]) << "request " << i;
    }
  }
}

TEST(EngineGraphGpu, SplitKvDecodeReplayMatchesEagerDecode) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto model = bf16_head64_llama(5);  // the tensor-core decode kernel, which splits the keys

  const Device dev = Device::cuda(0);
  const int64_t block_size = 16, max_model_len = 4096;
  synchronize(dev);  // the random weights were written on the legacy stream
  const OwnedStream stream(dev);
  const StreamGuard on_stream(stream.get());
  std::vector<KVCache> caches = allocate_kv_caches(model->cache_specs(), 512, block_size, dev);
  ModelRunner layout(*model, Variant::baseline, dev, block_size);  // prepare_inputs only; its own cache is unused

  // Five sequences from 2 to 1500 tokens (one to six 256-key partitions eagerly; the graph partitions for
  // 4096): prefill them eagerly, then decode one token each, eagerly and by replaying the graph of size 8.
  const std::vector<int64_t> lens = {700, 2, 300, 1500, 33};
  std::vector<Sequence> seqs(lens.size());
  int32_t next_block = 0;
  SchedulerOutput prefill, decode;
  for (size_t i = 0; i < lens.size(); ++i) {
    Sequence& s = seqs[i];
    s.id = int64_t(i);
    for (int64_t j = 0; j < lens[i]; ++j) s.prompt.push_back((int64_t(i) * 131 + j * 17 + 3) % model->vocab_size());
    for (int64_t b = 0; b < lens[i] / block_size + 1; ++b) s.block_table.push_back(next_block++);
    prefill.seqs.push_back({&s, 0, lens[i], true});
    prefill.num_tokens += lens[i];
  }
  prefill.num_prefills = int64_t(lens.size());
  {
    StepInputs in = layout.prepare_inputs(prefill);
    ForwardContextGuard ctx({&in.metadata, &caches});
    model->forward(in.input_ids, in.positions);
  }
  for (size_t i = 0; i < lens.size(); ++i) {
    seqs[i].output = {int64_t(i) + 1};
    seqs[i].num_computed_tokens = lens[i];
    decode.seqs.push_back({&seqs[i], lens[i], 1, true});
  }
  decode.num_tokens = int64_t(lens.size());

  std::vector<float> eager;
  {
    StepInputs in = layout.prepare_inputs(decode);
    ForwardContextGuard ctx({&in.metadata, &caches});
    eager = model->forward(in.input_ids, in.positions).to_floats();
  }
  CudaGraphRunner graphs(*model, caches, dev, stream.get(), {1, 2, 4, 8}, max_model_len, block_size);
  ASSERT_TRUE(graphs.can_run(decode));
  const Tensor replayed = graphs.run(decode);
  ASSERT_EQ(replayed.shape(), (Shape{int64_t(lens.size()), 256}));
  const std::vector<float> graph = replayed.to_floats();

  // Different key partitions and GEMM batch sizes change bf16 roundings, not the result: a wrong row, block
  // or split would be off by the whole signal.
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < eager.size(); ++i) {
    ASSERT_TRUE(std::isfinite(graph[i])) << "element " << i;
    diff2 += (double(graph[i]) - eager[i]) * (double(graph[i]) - eager[i]);
    ref2 += double(eager[i]) * eager[i];
  }
  EXPECT_LT(std::sqrt(diff2 / ref2), 2e-2);

  // A second replay of the same step reads the same inputs and gives the same bits.
  EXPECT_EQ(graphs.run(decode).to_floats(), graph);
}

namespace {

// `model` (on cuda:0) on the prompts of the transformers fixture in `dir`: every greedy token equal.
void expect_transformers_greedy(CausalLM& model, const std::string& dir) {
  std::ifstream f(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(f);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : expected["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
  GenerateOptions o;
  o.max_new_tokens = int64_t(expected["prompts"][0]["greedy_ids"].size());
  const GenerateResult r = generate_tokens(model, prompts, Device::cuda(0), Variant::baseline, o);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(r.tokens[i], expected["prompts"][i]["greedy_ids"].get<std::vector<int64_t>>()) << "prompt " << i;
}

}  // namespace

// The recurrent-state model: decode graphs read the sequences' state slots from a static buffer (padding rows have
// slot -1 and leave every state alone), so graph mode must give eager mode's tokens through whole and chunked
// prefills, slot reuse and preemption; and, in f32 on the GPU kernels, transformers' greedy tokens.
TEST(EngineGraphGpu, TinyMamba2GraphModeGivesTheEagerTokensAndTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const std::string dir = kbn::test::fixture_dir() + "/tiny-mamba2";
  auto model = build_model(resolve_model(dir), Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = mixed_requests(13, 40, model->vocab_size());
  EngineConfig whole;
  whole.max_model_len = 256;
  whole.num_kv_blocks = 512;
  whole.max_num_seqs = 16;
  EngineConfig chunked = whole;
  chunked.max_num_batched_tokens = 24;
  chunked.num_state_slots = 20;  // more slots than sequences: the graphs see slots above max_num_seqs
  EngineConfig preempting = whole;
  preempting.block_size = 4;
  preempting.num_kv_blocks = 40;
  for (const auto& [name, cfg, preempts] :
       {std::tuple{"whole prefills", whole, false}, std::tuple{"chunked prefills", chunked, false},
        std::tuple{"preemption", preempting, true}}) {
    SCOPED_TRACE(name);
    const EngineRun eager = run_engine(*model, cfg, ExecutionMode::eager, reqs);
    const EngineRun graph = run_engine(*model, cfg, ExecutionMode::graph, reqs);
    EXPECT_GT(graph.graph_steps, 0);
    EXPECT_EQ(graph.steps, eager.steps);
    if (preempts) {
      EXPECT_GT(graph.preemptions, 0);
    }
    ASSERT_EQ(graph.tokens.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(graph.tokens[i], eager.tokens[i]) << "request " << i;
  }
  expect_transformers_greedy(*model, dir);
}

// gpt-oss (sliding windows, sinks, swigluoai experts with biases): graph mode gives eager mode's tokens through whole
// and chunked prefills, and in f32 on the GPU kernels the model gives transformers' greedy tokens.
TEST(EngineGraphGpu, TinyGptOssGraphModeGivesTheEagerTokensAndTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const std::string dir = kbn::test::fixture_dir() + "/tiny-gpt-oss";
  auto model = build_model(resolve_model(dir), Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = mixed_requests(13, 40, model->vocab_size());
  EngineConfig whole;
  whole.max_model_len = 256;
  whole.num_kv_blocks = 512;
  whole.max_num_seqs = 16;
  EngineConfig chunked = whole;
  chunked.max_num_batched_tokens = 24;
  for (const auto& [name, cfg] : {std::pair{"whole prefills", whole}, std::pair{"chunked prefills", chunked}}) {
    SCOPED_TRACE(name);
    const EngineRun eager = run_engine(*model, cfg, ExecutionMode::eager, reqs);
    const EngineRun graph = run_engine(*model, cfg, ExecutionMode::graph, reqs);
    EXPECT_GT(graph.graph_steps, 0);
    ASSERT_EQ(graph.tokens.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(graph.tokens[i], eager.tokens[i]) << "request " << i;
  }
  expect_transformers_greedy(*model, dir);
}

// Overlapped nano-batches (engine/nano_batch.h): every eager step of two or more sequences split into 2 or 3
// nano-batches, each the whole model on a stream of its own, gives the greedy tokens of whole steps, in eager mode
// and in graph mode (decode-only steps replay graphs, the rest split), with chunked prefill and a tight pool, for a
// paged-KV model (tiny Llama), sliding windows, sinks and MoE (tiny gpt-oss), MLA's latent cache (tiny DeepSeek-V2,
// whose prefill shares a block-id table across streams) and recurrent state (tiny Mamba-2); f32 weights.
class NanoBatchGpu : public ::testing::TestWithParam<std::string> {};

namespace {

// Prefills in chunks of a 24-token budget sharing steps with decodes; and the same with a pool of about a third of
// what mixed_requests(13, 40, ..) grows to (4-token blocks per KV cache group, or 4 state slots): preemption.
std::pair<EngineConfig, EngineConfig> chunked_and_tight(const CausalLM& model) {
  EngineConfig chunked;
  chunked.max_model_len = 256;
  chunked.num_kv_blocks = 512;
  chunked.max_num_seqs = 16;
  chunked.max_num_batched_tokens = 24;
  EngineConfig tight = chunked;
  tight.block_size = 4;
  tight.num_kv_blocks = 40 * int64_t(kv_cache_groups(model.cache_specs()).windows.size());
  if (has_state_layers(model.cache_specs())) tight.num_state_slots = 4;
  return {chunked, tight};
}

}  // namespace

TEST_P(NanoBatchGpu, SplitStepsGiveTheTokensOfWholeSteps) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto model = build_model(resolve_model(kbn::test::fixture_dir() + "/" + GetParam()), Variant::baseline,
                           {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = mixed_requests(13, 40, model->vocab_size());
  const auto [chunked, tight] = chunked_and_tight(*model);
  for (const auto& [name, config] : {std::pair<const char*, EngineConfig>{"chunked", chunked}, {"tight pool", tight}}) {
    SCOPED_TRACE(name);
    const EngineRun whole = run_engine(*model, config, ExecutionMode::eager, reqs);
    NanoBatching staggered{3, 1};  // each nano-batch starts at the previous one's first attention (events)
    staggered.stagger = true;
    for (const NanoBatching nb :
         {NanoBatching{2, 1}, NanoBatching{3, 1}, NanoBatching{2, 1, NanoBatchSplit::by_kind}, staggered}) {
      for (const ExecutionMode mode : {ExecutionMode::eager, ExecutionMode::graph}) {
        SCOPED_TRACE(std::to_string(nb.count) + " nano-batches, " + nano_batch_split_name(nb.split) +
                     (nb.stagger ? ", staggered, " : ", ") + execution_mode_name(mode));
        EngineConfig cfg = config;
        cfg.nano_batching = nb;
        const EngineRun split = run_engine(*model, cfg, mode, reqs);
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

// Programmatic dependent launch (kbn/pdl.cuh): with the decode path's kernels launched to overlap the kernel before
// them, eager and graph mode give the tokens of plain launches: the tiny Llama in f32 (the generic attention kernel)
// and a two-layer bf16 Llama with head size 64 (the tensor-core split-KV decode kernel and its reduce), with chunked
// prefill. The bf16 model's contexts reach 1.5k tokens, so decode splits its keys.
TEST(EngineGraphGpu, DependentLaunchGivesTheTokensOfPlainLaunches) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  struct Case {
    const char* name;
    std::unique_ptr<CausalLM> model;
    std::vector<Request> reqs;
  };
  std::vector<Case> cases;
  cases.push_back({"tiny-llama f32",
                   build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-llama"), Variant::baseline,
                               {DType::f32, Device::cuda(0)}, 0),
                   {}});
  cases.push_back({"bf16 head 64", bf16_head64_llama(5), {}});
  // topk_softmax and fused_experts' decode-path GEMVs (up to 8 tokens a step), the second launched early.
  cases.push_back({"tiny-qwen3-moe bf16",
                   build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-qwen3-moe"), Variant::baseline,
                               {DType::bf16, Device::cuda(0)}, 0),
                   {}});
  cases[0].reqs = mixed_requests(13, 40, cases[0].model->vocab_size());
  cases[2].reqs = mixed_requests(13, 40, cases[2].model->vocab_size());
  for (int64_t i = 0; i < 6; ++i) {  // prompts of 300..1500 tokens, 24 new each
    Request r;
    r.id = i;
    for (int64_t j = 0; j < 300 + 240 * i; ++j)
      r.prompt.push_back((i * 97 + j * 31 + 5) % cases[1].model->vocab_size());
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = true;
    cases[1].reqs.push_back(std::move(r));
  }
  EngineConfig cfg;
  cfg.max_model_len = 2048;
  cfg.num_kv_blocks = 1024;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 512;
  for (Case& c : cases) {
    for (const ExecutionMode mode : {ExecutionMode::eager, ExecutionMode::graph}) {
      SCOPED_TRACE(std::string(c.name) + ", " + execution_mode_name(mode));
      set_dependent_launch(false);
      const EngineRun plain = run_engine(*c.model, cfg, mode, c.reqs);
      set_dependent_launch(true);
      const EngineRun pdl = run_engine(*c.model, cfg, mode, c.reqs);
      set_dependent_launch(false);
      ASSERT_EQ(pdl.tokens.size(), c.reqs.size());
      for (size_t i = 0; i < c.reqs.size(); ++i) EXPECT_EQ(pdl.tokens[i], plain.tokens[i]) << "request " << i;
    }
  }
}

// Async scheduling (EngineConfig::async_scheduling): each greedy step is launched and the next one scheduled and
// launched before its ids reach the host; the next step copies them on the device (into the graph's static input ids,
// or an eager step's). Eager and graph mode give the tokens of synchronous steps with chunked prefill, a tight pool
// (preemption while an id is in flight), EOS (a discarded token) and nano-batches, for a paged-KV model (tiny Llama),
// sliding windows, sinks and MoE (tiny gpt-oss), MLA (tiny DeepSeek-V2) and recurrent state (tiny Mamba-2).
class AsyncSchedulingGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(AsyncSchedulingGpu, GivesTheTokensOfSynchronousSteps) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto model = build_model(resolve_model(kbn::test::fixture_dir() + "/" + GetParam()), Variant::baseline,
                           {DType::f32, Device::cuda(0)}, 0);
  const std::vector<Request> reqs = mixed_requests(13, 40, model->vocab_size());
  const auto [chunked, tight] = chunked_and_tight(*model);
  const EngineRun sync = run_engine(*model, chunked, ExecutionMode::graph, reqs);
  // EOS: every request stops at the third token it generates (or at an earlier equal one).
  std::vector<Request> eos = reqs;
  for (size_t i = 0; i < eos.size(); ++i) {
    eos[i].sampling.ignore_eos = false;
    eos[i].sampling.eos_token_ids = {sync.tokens[i][std::min<size_t>(2, sync.tokens[i].size() - 1)]};
  }
  const EngineRun eos_sync = run_engine(*model, chunked, ExecutionMode::eager, eos);
  EngineConfig nano = chunked;
  nano.nano_batching = {2, 1};
  for (const ExecutionMode mode : {ExecutionMode::eager, ExecutionMode::graph}) {
    for (const auto& [name, config, requests, expected] :
         {std::tuple<const char*, EngineConfig, const std::vector<Request>*, const EngineRun*>{"chunked", chunked, &reqs,
                                                                                              &sync},
          {"tight pool", tight, &reqs, &sync},
          {"EOS", chunked, &eos, &eos_sync},
          {"2 nano-batches", nano, &reqs, &sync}}) {
      SCOPED_TRACE(std::string(name) + ", " + execution_mode_name(mode));
      EngineConfig cfg = config;
      cfg.async_scheduling = true;
      const EngineRun async = run_engine(*model, cfg, mode, *requests);
      if (mode == ExecutionMode::graph) {
        EXPECT_GT(async.graph_steps, 0);
      }
      ASSERT_EQ(async.tokens.size(), requests->size());
      for (size_t i = 0; i < requests->size(); ++i)
        EXPECT_EQ(async.tokens[i], expected->tokens[i]) << "request " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, AsyncSchedulingGpu,
                         ::testing::Values("tiny-llama", "tiny-gpt-oss", "tiny-deepseek-v2", "tiny-mamba2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });
