// Tensor parallelism on CPU ranks (one thread per rank, shared-memory collectives): the collectives, the group's
// error handling, and the whole sharded models (Llama, DeepSeek-V2, gpt-oss, Gemma-3, Qwen3, Qwen3-MoE, Mixtral,
// Mamba-2) against the Hugging Face fixtures at TP 2 and 4, which checks every parallel layer's shard of the checkpoint
// and every all-reduce and gather. Mamba-2 with sharded groups (no transformers fixture: its torch path normalises
// the gated output ungrouped) is held to TP 1 of one random model.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/comm.h"
#include "kbn/error.h"
#include "kbn/parallel_state.h"
#include "kbn/safetensors.h"
#include "engine_requests.h"
#include "test_paths.h"
#include "test_process.h"

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

// The other transformers fixtures have 4 heads and 2 kv heads: TP 2 gives each rank 2 heads and 1 kv head, TP 4 one
// head and a replica of one kv head. Gemma-3: sliding and global layers, q/k norms, the scaled embedding, the
// sandwich norms (replicated); Qwen3: q/k norms on each rank's heads; Qwen3-MoE (8 experts of 48) and Mixtral (4 of
// 96): every expert's intermediate size split, the router replicated.
TEST(TensorParallelGemma3, Tp2MatchesTransformers) { check_tp_against_hf("tiny-gemma3", 2); }
TEST(TensorParallelGemma3, Tp4MatchesTransformers) { check_tp_against_hf("tiny-gemma3", 4); }
TEST(TensorParallelQwen3, Tp2MatchesTransformers) { check_tp_against_hf("tiny-qwen3", 2); }
TEST(TensorParallelQwen3, Tp4MatchesTransformers) { check_tp_against_hf("tiny-qwen3", 4); }
TEST(TensorParallelQwen3Moe, Tp2MatchesTransformers) { check_tp_against_hf("tiny-qwen3-moe", 2); }
TEST(TensorParallelQwen3Moe, Tp4MatchesTransformers) { check_tp_against_hf("tiny-qwen3-moe", 4); }
TEST(TensorParallelMixtral, Tp2MatchesTransformers) { check_tp_against_hf("tiny-mixtral", 2); }
TEST(TensorParallelMixtral, Tp4MatchesTransformers) { check_tp_against_hf("tiny-mixtral", 4); }

// tiny-mamba2 (8 heads, one group of B and C, chunk 8; prompts of 11 and 23 tokens span several chunks, 16 greedy
// tokens run the decode path on the states the prefill left, each rank in its own state slots): TP 2 and 4 give each
// rank 4 and 2 heads (its z, x and dt rows of in_proj, its x rows of conv1d, its A_log, D, dt_bias), every rank all of
// B and C, and the gated norm's one group, which spans every rank's channels, is normalised from the all-gathered
// row.
TEST(TensorParallelMamba2, Tp2MatchesTransformers) { check_tp_against_hf("tiny-mamba2", 2); }
TEST(TensorParallelMamba2, Tp4MatchesTransformers) { check_tp_against_hf("tiny-mamba2", 4); }

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

using kbn::test::greedy_request;

std::vector<std::vector<int64_t>> tokens_of(const engine::RunResult& r) {
  std::vector<std::vector<int64_t>> t;
  for (const auto& o : r.outputs) t.push_back(o.tokens);
  return t;
}

// `reqs` through the engine at TP 1 and at TP 2 on CPU ranks, with a pool too small for them all (16 blocks of 4
// tokens: preemption) and 7 tokens a step (chunked prefill at offsets that are not multiples of the chunk).
std::pair<engine::RunResult, engine::RunResult> run_at_tp1_and_tp2(const engine::ModelSpec& spec,
                                                                   const std::vector<engine::Request>& reqs) {
  engine::EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 16;
  cfg.max_num_batched_tokens = 7;
  auto single = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  engine::LLMEngine one(*single, Variant::baseline, Device::cpu(), cfg);
  engine::RunResult r1 = one.run_to_completion(reqs);
  engine::TensorParallelGroup group(2, Device::cpu());
  const auto shards = engine::build_model_shards(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0, group);
  engine::LLMEngine two({shards[0].get(), shards[1].get()}, group, Variant::baseline, cfg);
  EXPECT_EQ(two.tp_size(), 2);
  return {std::move(r1), two.run_to_completion(reqs)};
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
    reqs.push_back(greedy_request(int64_t(reqs.size()), p["prompt_ids"].get<std::vector<int64_t>>(),
                              int64_t(p["greedy_ids"].size())));
  for (int64_t i = 0; i < 4; ++i) {  // more requests than the pool holds at once
    std::vector<int64_t> p;
    for (int64_t j = 0; j < 9 + 5 * i; ++j) p.push_back((i * 97 + j * 31 + 5) % 512);
    reqs.push_back(greedy_request(100 + i, p, 12));
  }
  const auto [r1, r2] = run_at_tp1_and_tp2(spec, reqs);
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

// ---- Mamba-2 with sharded groups: TP n against TP 1 of one random model ----

namespace {

// tiny-mamba2's config with `overrides` and random weights (seed 7) of its TP-1 model, written as a checkpoint in
// the transformers layout, so that every TP builds the same model from it (random weights alone are drawn per shard).
// The caller removes `dir`.
engine::ModelSpec random_mamba2_checkpoint(const std::string& overrides, const std::filesystem::path& dir) {
  engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-mamba2");
  spec.config = spec.config.with_overrides(overrides, "tiny-mamba2 with " + overrides);
  spec.weights_path.clear();
  const auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 7);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : model->named_parameters()) {
    Tensor t = *p.tensor;
    // The parameter is the depthwise conv as [conv_dim, width]; checkpoints hold nn.Conv1d's [conv_dim, 1, width].
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".conv1d.weight") == 0)
      t = t.contiguous().view({t.size(0), 1, t.size(1)});
    tensors.emplace_back(name, t);
  }
  spec.weights_path = (dir / "model.safetensors").string();
  save_safetensors(spec.weights_path, tensors);
  return spec;
}

// `prompts` through generate_tokens on `tp` CPU ranks: rank 0's result, after checking that every rank has the same
// tokens and logits.
engine::GenerateResult generate_on_ranks(const engine::ModelSpec& spec, int tp,
                                         const std::vector<std::vector<int64_t>>& prompts,
                                         const engine::GenerateOptions& opt) {
  engine::TensorParallelGroup group(tp, Device::cpu());
  std::vector<engine::GenerateResult> res(static_cast<size_t>(tp));
  group.run([&](int rank) {
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
    res[size_t(rank)] = engine::generate_tokens(*model, prompts, Device::cpu(), Variant::baseline, opt);
  });
  for (int r = 1; r < tp; ++r)
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(res[size_t(r)].tokens[i], res[0].tokens[i]) << "tp " << tp << " rank " << r << " prompt " << i;
      EXPECT_EQ(res[size_t(r)].prompt_logits[i].to_floats(), res[0].prompt_logits[i].to_floats())
          << "tp " << tp << " rank " << r << " prompt " << i;
    }
  return std::move(res[0]);
}

std::vector<int64_t> test_prompt(int64_t len, int64_t salt) {
  std::vector<int64_t> p;
  for (int64_t j = 0; j < len; ++j) p.push_back((salt * 131 + j * 37 + 11) % 512);
  return p;
}

// The model of `overrides` at each of `tps` against TP 1: prompt logits within 2e-5 (the ranks' partial sums in
// out_proj's all-reduce change only the accumulation order), identical greedy tokens. Prompts of 1 token (shorter
// than the conv), 11, 23 and 37 (past chunk_size 8: the scan's chunks and the state passed between them).
void check_mamba2_tp_equals_tp1(const std::string& overrides, const std::vector<int>& tps) {
  const std::filesystem::path dir = kbn::test::temp_dir("kbn_tp_mamba2");
  const engine::ModelSpec spec = random_mamba2_checkpoint(overrides, dir);
  const std::vector<std::vector<int64_t>> prompts = {test_prompt(1, 0), test_prompt(11, 1), test_prompt(23, 2),
                                                     test_prompt(37, 3)};
  engine::GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.return_prompt_logits = true;
  const engine::GenerateResult one = generate_on_ranks(spec, 1, prompts, opt);
  for (const int tp : tps) {
    const engine::GenerateResult many = generate_on_ranks(spec, tp, prompts, opt);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<float> a = one.prompt_logits[i].to_floats(), b = many.prompt_logits[i].to_floats();
      ASSERT_EQ(a.size(), b.size()) << overrides << " tp " << tp << " prompt " << i;
      double max_err = 0;
      for (size_t k = 0; k < a.size(); ++k) max_err = std::max(max_err, std::fabs(double(a[k]) - double(b[k])));
      EXPECT_LT(max_err, 2e-5) << overrides << " tp " << tp << " prompt " << i;
      EXPECT_EQ(many.tokens[i], one.tokens[i]) << overrides << " tp " << tp << " prompt " << i;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

// 4 groups of 2 heads: TP 2 gives each rank 2 groups (its B and C rows of in_proj and conv1d) with its 4 heads, and
// the gated norm runs on the rank's own 2 groups of 32 channels with its slice of norm.weight; TP 4 one group each.
TEST(TensorParallelMamba2, ShardedGroupsTp2AndTp4EqualTp1) { check_mamba2_tp_equals_tp1(R"({"n_groups": 4})", {2, 4}); }

// 2 groups of 4 heads at TP 2: one group per rank.
TEST(TensorParallelMamba2, TwoGroupsTp2EqualsTp1) { check_mamba2_tp_equals_tp1(R"({"n_groups": 2})", {2}); }

// Continuous batching with chunked prefill (7 tokens a step: prompts split at offsets that are not multiples of the
// chunk, the conv and SSM states carried between steps), mixed prefill/decode steps and preemption by recompute
// (16 blocks of 4 tokens) at TP 2 gives the tokens of TP 1, for sharded groups and for the one replicated group.
TEST(TensorParallelMamba2, EngineTp2EqualsTp1WithChunkingAndPreemption) {
  for (const std::string overrides : {R"({"n_groups": 2})", R"({"n_groups": 1})"}) {
    const std::filesystem::path dir = kbn::test::temp_dir("kbn_tp_mamba2_engine");
    const engine::ModelSpec spec = random_mamba2_checkpoint(overrides, dir);
    std::vector<engine::Request> reqs;
    for (int64_t i = 0; i < 6; ++i) reqs.push_back(greedy_request(i, test_prompt(5 + 7 * i, i), 10));
    const auto [r1, r2] = run_at_tp1_and_tp2(spec, reqs);
    EXPECT_GT(r1.preemptions, 0) << overrides;
    EXPECT_EQ(tokens_of(r2), tokens_of(r1)) << overrides;
    std::filesystem::remove_all(dir);
  }
}

// A tensor-parallel size that does not divide the heads, or the groups when there are several, is named with the
// field and its value.
TEST(TensorParallelMamba2, UnevenSplitsNameTheFields) {
  const auto build_error = [](const std::string& overrides, int tp) -> std::string {
    engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-mamba2");
    spec.config = spec.config.with_overrides(overrides, "tiny-mamba2 with " + overrides);
    engine::TensorParallelGroup group(tp, Device::cpu());
    try {
      group.run([&](int) { engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0); });
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << overrides << " at tp " << tp << " was accepted";
    return {};
  };
  const auto expect_in = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
  };
  expect_in(build_error("{}", 3), "argument 'num_heads' (8) must be divisible by the tensor-parallel size 3");
  // 2 groups on 4 ranks: each rank's 2 heads would need half a group.
  const std::string groups = build_error(R"({"n_groups": 2})", 4);
  expect_in(groups,
            "argument 'n_groups' (2) must be 1 (every rank holds the group) or divisible by the "
            "tensor-parallel size 4");
  expect_in(groups, "num_heads / tp = 2 of the 8 heads");
}
