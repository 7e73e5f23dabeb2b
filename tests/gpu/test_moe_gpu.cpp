// GPU tests of the MoE L1 ops (topk_softmax, moe_align_block_size, moe_sum, fused_experts): each on CUDA tensors
// against the same op on CPU tensors (the kbn::reference oracle) at small shapes that reach every kernel path
// (partial tiles, odd widths, several alignment chunks, ties), and, at the real models' expert shapes where the
// oracle is too slow, the bf16 Hopper expert GEMMs against the f32 SIMT ones.
//
// Tolerance: the op contract's default (bench::default_tolerance, two ulps of the output type); ids and the
// alignment compare exactly. The bf16-vs-f32 test's own tolerance is at the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "L1/fused_experts.h"
#include "L1/moe_align_block_size.h"
#include "L1/moe_sum.h"
#include "L1/topk_softmax.h"
#include "bench/validate.h"
#include "kbn/compare.h"
#include "kbn/device.h"
#include "kbn/device_errors.h"
#include "kbn/error.h"
#include "kbn/op_case.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"

using namespace kbn;
using namespace kbn::baseline;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

const Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

void expect_close(const Tensor& actual, const Tensor& expected, DType dt, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const CompareStats s = compare_close(actual.to(kCpu), expected.to(kCpu), bench::default_tolerance(dt));
  EXPECT_EQ(s.bad, 0) << what << ": " << s.describe();
  EXPECT_EQ(s.nan_actual, 0) << what;
}

void expect_equal_ints(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = actual.to(kCpu).to_ints(), e = expected.to(kCpu).to_ints();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != e[i]) {
      ADD_FAILURE() << what << ": first difference at flat index " << i << ": " << a[i] << " vs " << e[i];
      return;
    }
}

Tensor randn(const Shape& shape, DType dt, uint64_t seed, double std) {
  Tensor g = Tensor::empty(shape, dt, kGpu);
  fill_normal_(g, seed, 0.0, std);
  return g;
}

TEST(TopkSoftmaxGpu, MatchesTheOracleIncludingTies) {
  KBN_SKIP_WITHOUT_GPU();
  struct Shape3 {
    int64_t tokens, experts, k;
  };
  for (const Shape3 s : {Shape3{1, 8, 2}, Shape3{37, 8, 2}, Shape3{300, 128, 8}, Shape3{65, 60, 4}, Shape3{9, 256, 8},
                         Shape3{17, 512, 32}, Shape3{5, 3, 3}})
    for (const DType dt : {DType::bf16, DType::f16, DType::f32})
      for (const bool renormalize : {true, false}) {
        // Logits on a coarse grid (multiples of 0.25 in [-2, 2]) so that many tie.
        Tensor logits = randn({s.tokens, s.experts}, DType::f32, 11 + s.experts, 1.0).to(kCpu);
        std::vector<float> v(size_t(logits.numel()));
        const auto d = logits.to_doubles();
        for (size_t i = 0; i < v.size(); ++i) v[i] = float(std::round(std::clamp(d[i], -2.0, 2.0) * 4) / 4);
        const Tensor cpu = Tensor::from_floats(v, {s.tokens, s.experts}, dt);
        TopkSoftmax op(s.k, renormalize);
        auto [w_gpu, ids_gpu] = op.forward(cpu.to(kGpu));
        auto [w_cpu, ids_cpu] = op.forward(cpu);
        const std::string what = "T=" + std::to_string(s.tokens) + " E=" + std::to_string(s.experts) +
                                 " k=" + std::to_string(s.k) + " " + dtype_name(dt) +
                                 (renormalize ? " renormalized" : "");
        expect_equal_ints(ids_gpu, ids_cpu, what + " ids");
        expect_close(w_gpu, w_cpu, DType::f16, what + " weights");  // f32 softmax: well inside 2e-3
      }
}

TEST(TopkSoftmaxGpu, NanLogitsRankLast) {
  KBN_SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor logits = Tensor::from_floats({nan, 1.f, 3.f, nan, 2.f, 0.f}, {1, 6}, DType::f32).to(kGpu);
  auto [w, ids] = TopkSoftmax(3, true).forward(logits);
  EXPECT_EQ(ids.to(kCpu).to_ints(), (std::vector<int64_t>{2, 4, 1}));
  // ...and the NaN is an error at the next check after a synchronisation (to(kCpu) synchronised), raised once.
  try {
    check_device_errors();
    ADD_FAILURE() << "a NaN router logit raised no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gating_output' holds NaN in token 0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_device_errors());
  // A clean row records nothing.
  (void)TopkSoftmax(2, true).forward(Tensor::from_floats({0.f, 1.f, 3.f}, {1, 3}, DType::f32).to(kGpu));
  synchronize(kGpu);
  EXPECT_NO_THROW(check_device_errors());
}

// Checks the alignment invariants directly (used where the oracle refuses the input: out-of-range ids).
void expect_valid_alignment(const std::vector<int64_t>& ids, int64_t E, int64_t bs, const Tensor& sorted_t,
                            const Tensor& experts_t, const Tensor& post_t) {
  const auto sorted = sorted_t.to(kCpu).to_ints(), experts = experts_t.to(kCpu).to_ints();
  const int64_t post = post_t.to(kCpu).to_ints()[0], pairs = int64_t(ids.size());
  ASSERT_EQ(post % bs, 0);
  std::multiset<int64_t> seen;
  int64_t last_pair = -1, last_expert = -1;
  for (int64_t r = 0; r < int64_t(sorted.size()); ++r) {
    const int64_t p = sorted[size_t(r)];
    if (r >= post || p == pairs) {
      EXPECT_EQ(p, pairs) << "slot " << r;
      continue;
    }
    ASSERT_TRUE(p >= 0 && p < pairs) << "slot " << r;
    const int64_t e = experts[size_t(r / bs)];
    EXPECT_EQ(ids[size_t(p)], e) << "pair " << p << " sits in a block of expert " << e;
    if (e == last_expert) EXPECT_GT(p, last_pair) << "expert " << e << "'s pairs out of order";
    last_pair = p;
    last_expert = e;
    seen.insert(p);
  }
  for (int64_t p = 0; p < pairs; ++p)
    EXPECT_EQ(seen.count(p), (ids[size_t(p)] >= 0 && ids[size_t(p)] < E) ? 1u : 0u) << "pair " << p;
  for (int64_t b = post / bs; b < int64_t(experts.size()); ++b) EXPECT_EQ(experts[size_t(b)], E) << "block " << b;
}

TEST(MoeAlignBlockSizeGpu, MatchesTheOracleExactly) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, k, experts, block;
  };
  for (const Case c : {Case{1, 2, 8, 128}, Case{37, 2, 8, 16}, Case{300, 8, 128, 64}, Case{5000, 8, 128, 128},
                       Case{129, 1, 3, 1}, Case{700, 4, 1024, 32}, Case{0, 2, 8, 16}})
    for (const auto routing : {cases::Routing::uniform, cases::Routing::skewed}) {
      const Tensor ids = cases::routing_ids(c.tokens, c.k, c.experts, routing, kCpu, 5, "ids");
      MoeAlignBlockSize op(c.block, c.experts);
      auto [s_gpu, e_gpu, p_gpu] = op.forward(ids.to(kGpu));
      auto [s_cpu, e_cpu, p_cpu] = op.forward(ids);
      const std::string what = "T=" + std::to_string(c.tokens) + " k=" + std::to_string(c.k) +
                               " E=" + std::to_string(c.experts) + " bs=" + std::to_string(c.block) + " " +
                               cases::routing_name(routing);
      expect_equal_ints(s_gpu, s_cpu, what + " sorted_token_ids");
      expect_equal_ints(e_gpu, e_cpu, what + " expert_ids");
      expect_equal_ints(p_gpu, p_cpu, what + " num_tokens_post_padded");
    }
}

TEST(MoeAlignBlockSizeGpu, DropsOutOfRangeIds) {
  KBN_SKIP_WITHOUT_GPU();
  std::vector<int64_t> ids = cases::routing_ids(1500, 2, 16, cases::Routing::skewed, kCpu, 3, "ids").to_ints();
  for (size_t i = 0; i < ids.size(); i += 7) ids[i] = (i % 2) ? -1 : 16 + int64_t(i % 5);
  const Tensor t = Tensor::from_i32(std::vector<int32_t>(ids.begin(), ids.end()), {1500, 2});
  auto [sorted, experts, post] = MoeAlignBlockSize(16, 16).forward(t.to(kGpu));
  expect_valid_alignment(ids, 16, 16, sorted, experts, post);
}

TEST(MoeSumGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  for (const DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const auto& shape : {Shape{1, 2, 4096}, Shape{37, 8, 2048}, Shape{5, 3, 33}}) {
      const Tensor x = randn(shape, dt, 21, 1.0);
      expect_close(MoeSum().forward(x), MoeSum().forward(x.to(kCpu)), dt, std::string("moe_sum ") + dtype_name(dt));
    }
}

struct ExpertsInputs {
  Tensor x, w13, w2, weights, ids;  // on the GPU
};

ExpertsInputs experts_inputs(int64_t T, int64_t k, int64_t E, int64_t H, int64_t N, DType dt, cases::Routing r,
                             uint64_t seed) {
  return {randn({T, H}, dt, seed, 1.0), randn({E, 2 * N, H}, dt, seed + 1, 0.02), randn({E, H, N}, dt, seed + 2, 0.02),
          cases::routing_weights(T, k, kGpu, seed, "w"), cases::routing_ids(T, k, E, r, kGpu, seed, "ids")};
}

TEST(FusedExpertsGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, k, experts, hidden, inter;
  };
  // Partial tiles in every direction (inter not a multiple of 64, hidden not of 128, K not of 64), one alignment
  // block and several, widths the Hopper path refuses (hidden 100: rows not 16-byte multiples), each GEMM split along
  // K, and a launch large enough for the 256-wide tiles.
  for (const Case c : {Case{1, 2, 8, 256, 320}, Case{5, 2, 8, 200, 136}, Case{130, 2, 4, 128, 64},
                       Case{37, 8, 16, 96, 48}, Case{3, 1, 2, 100, 60},
                       Case{9, 2, 8, 1024, 256},     // few tiles, long K: GEMM 1 split along K (past the GEMV path's 8)
                       Case{10, 2, 8, 256, 1032},    // GEMM 2 split along K, its last split shorter
                       Case{8448, 2, 4, 512, 200}})  // enough full blocks for the 256-wide prefill tiles
    for (const DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const ExpertsInputs in =
          experts_inputs(c.tokens, c.k, c.experts, c.hidden, c.inter, dt, cases::Routing::skewed, 7);
      FusedExperts op;
      const Tensor gpu = op.forward(in.x, in.w13, in.w2, in.weights, in.ids);
      const Tensor cpu =
          op.forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu), in.weights.to(kCpu), in.ids.to(kCpu));
      expect_close(gpu, cpu, dt,
                   "T=" + std::to_string(c.tokens) + " k=" + std::to_string(c.k) + " E=" + std::to_string(c.experts) +
                       " H=" + std::to_string(c.hidden) + " N=" + std::to_string(c.inter) + " " + dtype_name(dt));
    }
}

// The decode path (at most 8 tokens and 64 pairs, 16-byte rows): each expert's rows streamed once for all its tokens.
// Experts shared by several tokens (skewed routing; two experts for eight tokens: 8 pairs each, a full pass), 64
// pairs, a token listing one expert twice (three pairs of one expert at two tokens: two passes of two), dropped ids,
// both biases with swigluoai; one token sums its experts straight into the output, more go through moe_sum.
TEST(FusedExpertsGpu, DecodePathMatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, k, experts, hidden, inter;
  };
  for (const Case c : {Case{1, 8, 128, 256, 96}, Case{1, 2, 8, 512, 136}, Case{2, 2, 8, 512, 136},
                       Case{4, 8, 16, 128, 64}, Case{8, 8, 128, 64, 32}, Case{8, 2, 2, 128, 64}, Case{3, 4, 4, 96, 40},
                       Case{1, 6, 64, 2048, 1408}})  // DeepSeek-V2-Lite's experts
    for (const DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const std::string what = "T=" + std::to_string(c.tokens) + " k=" + std::to_string(c.k) +
                               " E=" + std::to_string(c.experts) + " H=" + std::to_string(c.hidden) +
                               " N=" + std::to_string(c.inter) + " " + dtype_name(dt);
      const ExpertsInputs in =
          experts_inputs(c.tokens, c.k, c.experts, c.hidden, c.inter, dt, cases::Routing::skewed, 23);
      FusedExperts op;
      expect_close(op.forward(in.x, in.w13, in.w2, in.weights, in.ids),
                   op.forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu), in.weights.to(kCpu), in.ids.to(kCpu)), dt,
                   what);
      const Tensor b13 = randn({c.experts, 2 * c.inter}, dt, 33, 0.5), b2 = randn({c.experts, c.hidden}, dt, 34, 0.5);
      FusedExperts oai(FusedExperts::Activation::swigluoai, 1.702, 0.6);
      expect_close(oai.forward(in.x, in.w13, in.w2, in.weights, in.ids, b13, b2),
                   oai.forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu), in.weights.to(kCpu), in.ids.to(kCpu),
                               b13.to(kCpu), b2.to(kCpu)),
                   dt, what + " swigluoai, biases");
    }
  // A token listing expert 3 twice, and dropped ids (their pairs add nothing: the oracle's equivalent is a valid expert
  // with weight 0), at one token and at three.
  const int64_t E = 8, H = 128, N = 64;
  for (const auto& [T, ids, kept] :
       {std::tuple{int64_t(2), std::vector<int32_t>{3, 3, 3, 5}, std::vector<int32_t>{3, 3, 3, 5}},
        std::tuple{int64_t(1), std::vector<int32_t>{-1, 2, 8, 6}, std::vector<int32_t>{0, 2, 0, 6}},
        std::tuple{int64_t(3), std::vector<int32_t>{1, 9, 1, 1, -2, 4}, std::vector<int32_t>{1, 0, 1, 1, 0, 4}}}) {
    const int64_t k = int64_t(ids.size()) / T;
    const ExpertsInputs in = experts_inputs(T, k, E, H, N, DType::bf16, cases::Routing::uniform, 29);
    std::vector<double> w = in.weights.to(kCpu).to_doubles();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] != kept[i]) w[i] = 0;
    const Tensor gpu = FusedExperts().forward(in.x, in.w13, in.w2, in.weights, Tensor::from_i32(ids, {T, k}).to(kGpu));
    const Tensor cpu = FusedExperts().forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu),
                                              Tensor::from_floats(std::vector<float>(w.begin(), w.end()), {T, k}),
                                              Tensor::from_i32(kept, {T, k}));
    expect_close(gpu, cpu, DType::bf16, "T=" + std::to_string(T) + " repeated and dropped ids");
  }
}

// forward_add's bits are those of forward then a two-term moe_sum with the addend, on every path: one token on the
// decode path (the addend added in GEMM 2's kernel), several tokens there, and the grouped GEMMs.
TEST(FusedExpertsGpu, AddendGivesTheBitsOfATwoTermMoeSum) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, k, experts, hidden, inter;
  };
  for (const Case c : {Case{1, 6, 64, 2048, 1408}, Case{1, 2, 8, 256, 96}, Case{3, 4, 16, 256, 96},
                       Case{40, 2, 8, 256, 96}})
    for (const DType dt : {DType::bf16, DType::f32}) {
      const std::string what = "T=" + std::to_string(c.tokens) + " k=" + std::to_string(c.k) +
                               " H=" + std::to_string(c.hidden) + " " + dtype_name(dt);
      const ExpertsInputs in = experts_inputs(c.tokens, c.k, c.experts, c.hidden, c.inter, dt, cases::Routing::skewed, 41);
      const Tensor addend = randn({c.tokens, c.hidden}, dt, 43, 0.05);
      FusedExperts op;
      const Tensor routed = op.forward(in.x, in.w13, in.w2, in.weights, in.ids);
      Tensor both = Tensor::empty({c.tokens, 2, c.hidden}, dt, kGpu);
      both.select(1, 0).copy_(routed);
      both.select(1, 1).copy_(addend);
      const Tensor want = MoeSum().forward(both).to(kCpu);
      const Tensor got = op.forward_add(addend, in.x, in.w13, in.w2, in.weights, in.ids).to(kCpu);
      const CompareStats s = compare_close(got, want, Tolerance{0, 0});
      EXPECT_EQ(s.bad, 0) << what << ": " << s.describe();
    }
}

TEST(FusedExpertsGpu, OutOfRangeIdsAreDropped) {
  KBN_SKIP_WITHOUT_GPU();
  const int64_t T = 50, k = 2, E = 8, H = 128, N = 192;
  ExpertsInputs in = experts_inputs(T, k, E, H, N, DType::bf16, cases::Routing::uniform, 9);
  std::vector<int64_t> ids = in.ids.to(kCpu).to_ints();
  std::vector<double> w = in.weights.to(kCpu).to_doubles();
  std::vector<int64_t> bad = ids;
  for (size_t i = 0; i < ids.size(); i += 5) {
    bad[i] = (i % 2) ? -3 : E;
    ids[i] = 0;  // the oracle's equivalent: a valid expert with weight 0
    w[i] = 0;
  }
  const Tensor gpu = FusedExperts().forward(
      in.x, in.w13, in.w2, in.weights, Tensor::from_i32(std::vector<int32_t>(bad.begin(), bad.end()), {T, k}).to(kGpu));
  const Tensor cpu =
      FusedExperts().forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu),
                             Tensor::from_floats(std::vector<float>(w.begin(), w.end()), {T, k}, DType::f32),
                             Tensor::from_i32(std::vector<int32_t>(ids.begin(), ids.end()), {T, k}));
  expect_close(gpu, cpu, DType::bf16, "dropped pairs");
}

// At the real expert shapes the double-precision oracle is too slow; the bf16 Hopper kernels are checked against
// the f32 SIMT kernels on the same values (their difference is the bf16 rounding of the intermediates).
TEST(FusedExpertsGpu, HopperMatchesF32AtModelShapes) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    const char* model;
    int64_t k, experts, hidden, inter;
  };
  for (const Case c : {Case{"qwen3-30b-a3b", 8, 128, 2048, 768}, Case{"mixtral-8x7b", 2, 8, 4096, 14336}})
    for (const int64_t T : {1, 64, 700, 4096})  // 4096: both models on the 256-wide tiles
      for (const auto routing : {cases::Routing::uniform, cases::Routing::skewed}) {
        const ExpertsInputs in = experts_inputs(T, c.k, c.experts, c.hidden, c.inter, DType::bf16, routing, 13);
        FusedExperts op;
        const Tensor bf16 = op.forward(in.x, in.w13, in.w2, in.weights, in.ids);
        const Tensor f32 =
            op.forward(in.x.to(DType::f32), in.w13.to(DType::f32), in.w2.to(DType::f32), in.weights, in.ids);
        // The bf16 path rounds g, u, the activation and each expert's output to bf16, so an element where the
        // top_k outputs cancel carries a few bf16 ulps of the summands' scale: atol 4e-2 of the output's rms per
        // element, and the mean relative error (sum |a - e| / sum |e|) within 5e-3.
        const std::string what = std::string(c.model) + " T=" + std::to_string(T) + " " + cases::routing_name(routing);
        const CompareStats s = compare_close(bf16.to(DType::f32).to(kCpu), f32.to(kCpu), Tolerance{1.6e-2, 4e-2, 0});
        EXPECT_EQ(s.bad, 0) << what << ": " << s.describe();
        EXPECT_LT(s.mean_rel_err(), 5e-3) << what << ": " << s.describe();
      }
}

}  // namespace

namespace {

// gpt-oss's experts: swigluoai (a small limit, so the clamps bite) and both biases, through every path: unsplit and
// split GEMM 1 and 2 (their reduce kernels add the biases), the 256-wide tiles, the SIMT kernels (f32; hidden 100).
TEST(FusedExpertsGpu, SwigluoaiWithBiasesMatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, k, experts, hidden, inter;
  };
  for (const Case c : {Case{5, 4, 8, 200, 136}, Case{37, 4, 16, 96, 48}, Case{3, 1, 2, 100, 60},
                       Case{9, 2, 8, 1024, 256}, Case{10, 2, 8, 256, 1032}, Case{8448, 2, 4, 512, 200}})
    for (const DType dt : {DType::bf16, DType::f32}) {
      const ExpertsInputs in =
          experts_inputs(c.tokens, c.k, c.experts, c.hidden, c.inter, dt, cases::Routing::skewed, 21);
      const Tensor b13 = randn({c.experts, 2 * c.inter}, dt, 31, 0.5), b2 = randn({c.experts, c.hidden}, dt, 32, 0.5);
      FusedExperts op(FusedExperts::Activation::swigluoai, 1.702, 0.6);
      const Tensor gpu = op.forward(in.x, in.w13, in.w2, in.weights, in.ids, b13, b2);
      const Tensor cpu = op.forward(in.x.to(kCpu), in.w13.to(kCpu), in.w2.to(kCpu), in.weights.to(kCpu),
                                    in.ids.to(kCpu), b13.to(kCpu), b2.to(kCpu));
      const std::string what = "T=" + std::to_string(c.tokens) + " k=" + std::to_string(c.k) +
                               " E=" + std::to_string(c.experts) + " H=" + std::to_string(c.hidden) +
                               " N=" + std::to_string(c.inter) + " " + dtype_name(dt);
      expect_close(gpu, cpu, dt, what);
      // The biases and the activation matter: without them the output differs.
      const Tensor plain = FusedExperts().forward(in.x, in.w13, in.w2, in.weights, in.ids);
      EXPECT_GT(compare_close(plain.to(DType::f32).to(kCpu), cpu.to(DType::f32), Tolerance{1e-3, 1e-3, 0}).bad, 0)
          << what;
    }
}

// gpt-oss-20b's expert shapes (32 experts of 2880 x 2880, top 4), bf16 against f32 on the same values.
TEST(FusedExpertsGpu, SwigluoaiHopperMatchesF32AtGptOssShapes) {
  KBN_SKIP_WITHOUT_GPU();
  const int64_t k = 4, E = 32, H = 2880, N = 2880;
  for (const int64_t T : {1, 64, 4096}) {
    const ExpertsInputs in = experts_inputs(T, k, E, H, N, DType::bf16, cases::Routing::uniform, 17);
    const Tensor b13 = randn({E, 2 * N}, DType::bf16, 41, 1.0), b2 = randn({E, H}, DType::bf16, 42, 1.0);
    FusedExperts op(FusedExperts::Activation::swigluoai, 1.702, 7.0);
    const Tensor bf16 = op.forward(in.x, in.w13, in.w2, in.weights, in.ids, b13, b2);
    const Tensor f32 = op.forward(in.x.to(DType::f32), in.w13.to(DType::f32), in.w2.to(DType::f32), in.weights, in.ids,
                                  b13.to(DType::f32), b2.to(DType::f32));
    const CompareStats s = compare_close(bf16.to(DType::f32).to(kCpu), f32.to(kCpu), Tolerance{1.6e-2, 4e-2, 0});
    EXPECT_EQ(s.bad, 0) << "T=" << T << ": " << s.describe();
    EXPECT_LT(s.mean_rel_err(), 5e-3) << "T=" << T << ": " << s.describe();
  }
}

}  // namespace
