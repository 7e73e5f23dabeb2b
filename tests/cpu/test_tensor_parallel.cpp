// Tensor parallelism on CPU ranks (one thread per rank, shared-memory collectives): the collectives, the group's
// error handling, and the whole sharded Llama and DeepSeek-V2 against the Hugging Face fixtures at TP 2 and 4, which
// checks every parallel layer's shard of the checkpoint and every all-reduce and the logits gather.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/comm.h"
#include "kbn/error.h"
#include "kbn/parallel_state.h"
#include "test_paths.h"

using namespace kbn;

TEST(CpuGroup, AllReduceSumsInRankOrderAndEveryRankGetsTheSameBits) {
  for (const int n : {1, 2, 3, 4}) {
    engine::TensorParallelGroup group(n, Device::cpu());
    std::vector<std::vector<float>> out(static_cast<size_t>(n));
    group.run([&](int rank) {
      // Values whose float sum depends on the order: every rank must still agree bit for bit.
      std::vector<float> v(1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(rank + 1) * 0.1f + float(i) * 1e-7f * float(rank * 7 + 1);
      Tensor x = Tensor::from_floats(v, {10, 100});
      parallel_state().comm->all_reduce_sum(x);
      out[size_t(rank)] = x.to_floats();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[size_t(r)], out[0]) << "n " << n << " rank " << r;
      float expect = 0;
      for (int k = 0; k < n; ++k) expect += float(k + 1) * 0.1f;  // element 0, summed in rank order
      EXPECT_EQ(out[size_t(r)][0], expect) << "n " << n;
    }
  }
}

TEST(CpuGroup, AllReduceKeepsTheDtype) {
  engine::TensorParallelGroup group(2, Device::cpu());
  group.run([&](int rank) {
    Tensor x = Tensor::full({4, 8}, 1.5 + rank, DType::bf16);
    parallel_state().comm->all_reduce_sum(x);
    EXPECT_EQ(x.dtype(), DType::bf16);
    EXPECT_EQ(x.to_floats()[5], 4.0f);
  });
}

TEST(CpuGroup, AllGatherStacksTheRanksInOrder) {
  engine::TensorParallelGroup group(3, Device::cpu());
  group.run([&](int rank) {
    Tensor x = Tensor::full({2, 5}, double(rank), DType::f32);
    Tensor g = parallel_state().comm->all_gather(x);
    ASSERT_EQ(g.shape(), (Shape{3, 2, 5}));
    const std::vector<float> v = g.to_floats();
    for (int r = 0; r < 3; ++r) EXPECT_EQ(v[size_t(r) * 10 + 7], float(r));
  });
}

TEST(CpuGroup, MismatchedShapesNameBothRanks) {
  engine::TensorParallelGroup group(2, Device::cpu());
  try {
    group.run([&](int rank) {
      Tensor x = Tensor::zeros({4, rank == 0 ? 8 : 9}, DType::f32);
      parallel_state().comm->all_reduce_sum(x);
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("every rank must pass the same shape and dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 9]"), std::string::npos) << m;
  }
}

// A rank that fails before a collective must not leave the others waiting in it forever.
TEST(CpuGroup, OneRankFailingReleasesTheOthers) {
  engine::TensorParallelGroup group(3, Device::cpu());
  std::atomic<int> released{0};
  try {
    group.run([&](int rank) {
      if (rank == 1) KBN_FAIL("rank 1 cannot build its shard");
      Tensor x = Tensor::zeros({16}, DType::f32);
      try {
        parallel_state().comm->all_reduce_sum(x);
      } catch (const Error&) {
        released++;
        throw;
      }
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 cannot build its shard"), std::string::npos) << e.what();
  }
  EXPECT_EQ(released.load(), 2);
}

TEST(TensorParallelGroup, ChecksItsSize) {
  EXPECT_THROW(engine::TensorParallelGroup(0, Device::cpu()), Error);
}

namespace {

// The sharded model on `tp` CPU ranks against transformers' logits and greedy tokens: the same tolerance as
// the TP-1 test (tests/cpu/test_llama_hf.cpp); the rank-by-rank partial sums change only the accumulation
// order.
void check_tp_against_hf(const std::string& name, int tp) {
  const std::string dir = kbn::test::fixture_dir() + "/" + name;
  std::ifstream f(dir + "/expected.json");
  ASSERT_TRUE(f.good()) << dir;
  const nlohmann::json expected = nlohmann::json::parse(f);
  const engine::ModelSpec spec = engine::resolve_model(dir);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : expected["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int64_t>>());
  engine::GenerateOptions opt;
  opt.max_new_tokens = int64_t(expected["prompts"][0]["greedy_ids"].size());
  opt.return_prompt_logits = true;

  engine::TensorParallelGroup group(tp, Device::cpu());
  std::vector<engine::GenerateResult> res(static_cast<size_t>(tp));
  group.run([&](int rank) {
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
    res[size_t(rank)] = engine::generate_tokens(*model, prompts, Device::cpu(), Variant::baseline, opt);
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = expected["prompts"][i];
    const auto hf = p["prompt_logits"].get<std::vector<std::vector<double>>>();
    const std::vector<float> ours = res[0].prompt_logits[i].to_floats();
    const int64_t vocab = res[0].prompt_logits[i].size(1);
    ASSERT_EQ(vocab, int64_t(hf[0].size())) << name;
    double max_err = 0;
    for (size_t t = 0; t < hf.size(); ++t)
      for (int64_t v = 0; v < vocab; ++v)
        max_err = std::max(max_err, std::fabs(double(ours[t * size_t(vocab) + size_t(v)]) - hf[t][size_t(v)]));
    EXPECT_LT(max_err, 2e-5) << name << " tp " << tp << " prompt " << i;
    EXPECT_EQ(res[0].tokens[i], p["greedy_ids"].get<std::vector<int64_t>>()) << name << " tp " << tp;
    for (int r = 1; r < tp; ++r) {
      EXPECT_EQ(res[size_t(r)].tokens[i], res[0].tokens[i]) << name << " rank " << r;
      EXPECT_EQ(res[size_t(r)].prompt_logits[i].to_floats(), ours) << name << " rank " << r;
    }
  }
}

}  // namespace

// tiny-llama: 4 heads, 2 kv heads, vocab 512, sharded checkpoint. TP 2 splits every head group.
TEST(TensorParallelLlama, Tp2MatchesTransformers) { check_tp_against_hf("tiny-llama", 2); }

// Tied embeddings: the LM head shares the vocab-parallel embedding's shard.
TEST(TensorParallelLlama, Tp2TiedEmbeddingsMatchTransformers) { check_tp_against_hf("tiny-llama-tied", 2); }

// 8 heads, 2 kv heads: TP 4 replicates each kv head on two ranks.
TEST(TensorParallelLlama, Tp4ReplicatedKvHeadsMatchTransformers) { check_tp_against_hf("tiny-llama-peaky-gqa", 4); }

// tiny-deepseek-v2 (multi-head latent attention + routed and shared experts): TP 2 gives each rank 2 of the 4 heads
// (q_proj and kv_b_proj by head, so each rank's absorbed W_UK_T / W_UV are its heads'), half of every expert's and of
// the shared MLP's intermediate size, and replicates the latent (kv_a_proj_with_mqa); TP 4 one head per rank.
TEST(TensorParallelDeepseekV2, Tp2MatchesTransformers) { check_tp_against_hf("tiny-deepseek-v2", 2); }
TEST(TensorParallelDeepseekV2, Tp4MatchesTransformers) { check_tp_against_hf("tiny-deepseek-v2", 4); }

// tiny-gpt-oss (sinks, sliding windows, swigluoai experts with biases): TP 2 gives each rank 2 of the 4 heads and
// their sinks, 1 of the 2 kv heads, half of every expert's intermediate size (its de-interleaved gate and up columns
// and their biases), and the down-projection bias to rank 0 only; TP 4 one head per rank, each kv head replicated.
TEST(TensorParallelGptOss, Tp2MatchesTransformers) { check_tp_against_hf("tiny-gpt-oss", 2); }
TEST(TensorParallelGptOss, Tp4MatchesTransformers) { check_tp_against_hf("tiny-gpt-oss", 4); }

TEST(TensorParallelLlama, UnevenSplitNamesWhatCannotBeSplit) {
  const engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  engine::TensorParallelGroup group(3, Device::cpu());
  try {
    group.run([&](int) { engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not divisible by the tensor-parallel size 3"), std::string::npos)
        << e.what();
  }
}

// ---- the serving engine on CPU ranks ----

namespace {

engine::Request tp_request(int64_t id, std::vector<int64_t> prompt, int64_t max_tokens) {
  engine::Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::vector<std::vector<int64_t>> tokens_of(const engine::RunResult& r) {
  std::vector<std::vector<int64_t>> t;
  for (const auto& o : r.outputs) t.push_back(o.tokens);
  return t;
}

}  // namespace

// Continuous batching with chunked prefill and preemption (a small KV pool) at TP 2 gives the tokens of TP 1,
// and both give transformers' greedy tokens.
TEST(TensorParallelEngine, Tp2EqualsTp1WithChunkingAndPreemption) {
  const std::string dir = kbn::test::fixture_dir() + "/tiny-llama";
  std::ifstream f(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(f);
  const engine::ModelSpec spec = engine::resolve_model(dir);
  std::vector<engine::Request> reqs;
  for (const auto& p : expected["prompts"])
    reqs.push_back(tp_request(int64_t(reqs.size()), p["prompt_ids"].get<std::vector<int64_t>>(),
                              int64_t(p["greedy_ids"].size())));
  for (int64_t i = 0; i < 4; ++i) {  // more requests than the pool holds at once
    std::vector<int64_t> p;
    for (int64_t j = 0; j < 9 + 5 * i; ++j) p.push_back((i * 97 + j * 31 + 5) % 512);
    reqs.push_back(tp_request(100 + i, p, 12));
  }
  engine::EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 16;
  cfg.max_num_batched_tokens = 7;

  auto single = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::LLMEngine one(*single, Variant::baseline, Device::cpu(), cfg);
  const engine::RunResult r1 = one.run_to_completion(reqs);

  engine::TensorParallelGroup group(2, Device::cpu());
  const auto shards = engine::build_model_shards(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0, group);
  engine::LLMEngine two({shards[0].get(), shards[1].get()}, group, Variant::baseline, cfg);
  EXPECT_EQ(two.tp_size(), 2);
  const engine::RunResult r2 = two.run_to_completion(reqs);

  EXPECT_GT(r1.preemptions, 0);
  EXPECT_EQ(tokens_of(r2), tokens_of(r1));
  for (size_t i = 0; i < expected["prompts"].size(); ++i)
    EXPECT_EQ(r2.outputs[i].tokens, expected["prompts"][i]["greedy_ids"].get<std::vector<int64_t>>()) << i;
}

TEST(TensorParallelEngine, ShardCountMustMatchTheGroup) {
  const engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::TensorParallelGroup group(2, Device::cpu());
  engine::EngineConfig cfg;
  cfg.max_model_len = 64;
  EXPECT_THROW(engine::LLMEngine({model.get()}, group, Variant::baseline, cfg), Error);
}
