// The validation's routing near-tie exemption (bench/validate.h, OpEntry::router_inside): the oracle's router records
// the tokens whose top_k-th and next logits are within 4 ulps (reference::RoutingTieLog); a MoE block whose routing
// differs from the baseline's only on such tokens passes, with the exempt rows counted; one that routes a token
// without a tie differently still fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <set>
#include <string>

#include "bench/cases.h"
#include "bench/validate.h"
#include "kbn/config.h"
#include "kbn/module.h"
#include "kbn/registry.h"
#include "wrapped_op.h"
#include "reference/reference.h"

using namespace kbn;

namespace {

// bf16 logits, one row per token.
Tensor bf16_rows(const std::vector<std::vector<float>>& rows) {
  std::vector<float> v;
  for (const auto& r : rows) v.insert(v.end(), r.begin(), r.end());
  return Tensor::from_floats(v, {int64_t(rows.size()), int64_t(rows[0].size())}, DType::bf16);
}

std::set<int64_t> tied_rows(const Tensor& logits, int64_t k) {
  Tensor w = Tensor::empty({logits.size(0), k}, DType::f32), ids = Tensor::empty({logits.size(0), k}, DType::i32);
  const reference::RoutingTieLog log;
  reference::topk_softmax(w, ids, logits, true);
  return log.rows();
}

}  // namespace

TEST(RoutingTies, TopkSoftmaxRecordsTokensWhoseBoundaryLogitsAreWithinFourUlps) {
  // bf16 has 8 significant bits: its ulp in [1, 2) is 2^-7.
  const float u = 1.0f / 128;
  const Tensor logits = bf16_rows({
      {1.0f, 1.0f + 4 * u, 0.25f, -1.0f},  // top-1 boundary 4 ulps: recorded
      {1.0f, 1.0f + 8 * u, 0.25f, -1.0f},  // 8 ulps: a rounding cannot swap them
      {0.0f, 0.0f, 0.0f, 0.0f},            // all equal (an all-zero input row): computed exactly everywhere
      {2.0f, 0.5f, 0.5f, -1.0f},           // the tie is below the boundary (2nd and 3rd), top-1 clear
      {-3.0f, 0.5f, 0.5f, 0.5f},           // a tie at the boundary itself
  });
  EXPECT_EQ(tied_rows(logits, 1), (std::set<int64_t>{0, 4}));
  EXPECT_EQ(tied_rows(logits, 2), (std::set<int64_t>{3, 4}));  // row 0: 1.0 vs 0.25 at the 2nd boundary
  EXPECT_TRUE(tied_rows(logits, 4).empty());                   // every expert chosen: no boundary
  // Nothing is recorded without a log, and one log per thread.
  Tensor w = Tensor::empty({5, 1}, DType::f32), ids = Tensor::empty({5, 1}, DType::i32);
  reference::topk_softmax(w, ids, logits, true);
  const reference::RoutingTieLog log;
  EXPECT_THROW(reference::RoutingTieLog(), Error);
}

namespace {

using test::WrappedOp;  // the CPU baseline op with another forward (tests/wrapped_op.h)

struct MoeFixture {
  bench::BenchCase c;
  OpEntry entry;
  std::unique_ptr<AnyOp> make() const {
    OpArgs a = c.args;
    a.opts = ParamOptions{c.dtype, Device::cpu()};
    auto op = entry.make(a);
    init_random_weights(op->module(), 1, 0.02);
    return op;
  }
};

// tiny-mixtral's MixtralMoE (8 experts, top-2) on 256 tokens.
MoeFixture mixtral_fixture() {
  const ModelConfig cfg = ModelConfig::load(std::string(KBN_SOURCE_DIR) + "/models/tiny-mixtral.json");
  bench::CaseOptions o;
  o.tokens = {256};
  MoeFixture f;
  f.c = bench::cases_for("mixtral_moe", bench::model_view("tiny-mixtral", cfg, 1), o).at(0);
  f.entry = registry(Variant::baseline).get("mixtral_moe");
  return f;
}

// The block recomputed from its weights and its bf16 router logits, as the baseline computes it, except that
// `tie_ulps` > 0 routes every token whose 2nd and 3rd best logits lie within that many ulps to the 3rd instead of the
// 2nd (what a gate GEMM rounding those two logits the other way does: a correct implementation), and `misroute` >= 0
// sends that token to its worst expert instead of its best.
std::vector<Tensor> moe_forward(AnyOp& op, const Tensor& x, int tie_ulps, int64_t misroute) {
  const Module& m = op.module();
  const Tensor& gate = *m.parameter("gate.weight").tensor;
  const Tensor& w13 = *m.parameter("experts.w13_weight").tensor;
  const Tensor& w2 = *m.parameter("experts.w2_weight").tensor;
  const int64_t T = x.size(0), E = gate.size(0), k = 2;
  Tensor logits = Tensor::empty({T, E}, x.dtype());
  reference::linear(logits, x, gate, Tensor());
  const std::vector<double> l = logits.to_doubles();
  std::vector<float> w(size_t(T * k));
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    const double* row = l.data() + t * E;
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    int e = 0;
    (void)std::frexp(std::max(std::abs(row[order[1]]), std::abs(row[order[2]])), &e);
    const double ulp = std::ldexp(1.0, e - 8);  // bf16: 8 significant bits
    if (tie_ulps > 0 && row[order[1]] != row[order[2]] && row[order[1]] - row[order[2]] <= tie_ulps * ulp)
      std::swap(order[1], order[2]);
    if (t == misroute) std::swap(order[0], order[size_t(E - 1)]);
    const double mx = row[order[0]] > row[order[1]] ? row[order[0]] : row[order[1]];
    const double p0 = std::exp(row[order[0]] - mx), p1 = std::exp(row[order[1]] - mx);
    w[size_t(t * k)] = float(p0 / (p0 + p1));
    w[size_t(t * k + 1)] = float(p1 / (p0 + p1));
    ids[size_t(t * k)] = int32_t(order[0]);
    ids[size_t(t * k + 1)] = int32_t(order[1]);
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  reference::fused_experts(out, x, w13, w2, Tensor::from_floats(w, {T, k}, DType::f32), Tensor::from_i32(ids, {T, k}));
  return {out};
}

bench::Validation validate(const MoeFixture& f, const WrappedOp::Hook& hook) {
  auto base = f.make();
  WrappedOp cand(f.make(), hook);
  auto oracle = f.make();
  bench::ValidationOptions vo;
  vo.seeds = 2;
  return bench::validate_candidate(f.c, f.entry, *base, cand, oracle.get(), Device::cpu(), 5, vo);
}

}  // namespace

TEST(RoutingTies, ABlockRoutingNearTiesTheOtherWayPassesWithThoseRowsExempt) {
  const MoeFixture f = mixtral_fixture();
  ASSERT_TRUE(f.entry.router_inside);
  // The recomputation is the baseline itself: no exemption needed.
  const auto same = validate(f, [](AnyOp& op, const std::vector<Tensor>& a) { return moe_forward(op, a[0], 0, -1); });
  EXPECT_TRUE(same.pass) << same.reason;
  EXPECT_EQ(same.routing_tie_rows, 0);
  // Tokens whose 2nd and 3rd logits are within 2 ulps go to the 3rd expert.
  const WrappedOp::Hook other = [](AnyOp& op, const std::vector<Tensor>& a) { return moe_forward(op, a[0], 2, -1); };
  const bench::Validation v = validate(f, other);
  EXPECT_TRUE(v.pass) << v.reason;
  EXPECT_GT(v.routing_tie_rows, 0);
  EXPECT_GT(v.routing_tie_comparisons, 0);
  std::printf("%s\n", v.summary().c_str());
  EXPECT_NE(v.summary().find("near-tied routing rows exempt"), std::string::npos) << v.summary();
  // Without the exemption the same candidate fails on those rows.
  MoeFixture strict = f;
  strict.entry.router_inside = false;
  const bench::Validation s = validate(strict, other);
  EXPECT_FALSE(s.pass);
  EXPECT_EQ(s.check, "tolerance");
}

TEST(RoutingTies, ATokenRoutedDifferentlyWithoutATieStillFails) {
  const MoeFixture f = mixtral_fixture();
  // Token 1 to its worst expert instead of its best: no tie explains that.
  const auto v = validate(f, [](AnyOp& op, const std::vector<Tensor>& a) { return moe_forward(op, a[0], 0, 1); });
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.check, "tolerance");
  EXPECT_NE(v.reason.find("at [1, "), std::string::npos) << v.reason;  // the first bad element is in row 1
}
