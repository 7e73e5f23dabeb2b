// The validation machinery of `kb_nano kernels` on CPU tensors: the allocation audit (poison and guard
// zones), device-side comparison semantics, and validate_candidate against small hand-made misbehaving ops
// (the full cheat corpus runs as candidate_build.cheats).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "bench/cases.h"
#include "bench/profile.h"
#include "bench/timing.h"
#include "bench/validate.h"
#include "kbn/allocator.h"
#include "kbn/compare.h"
#include "kbn/config.h"
#include "kbn/module.h"
#include "kbn/registry.h"
#include "wrapped_op.h"

using namespace kbn;

namespace {

TEST(AllocationAudit, PoisonsNewAllocationsAndCatchesWritesPastTheEnd) {
  Tensor t;
  {
    AllocationAudit audit;
    t = Tensor::empty({3, 5}, DType::f32);
  }
  EXPECT_EQ(count_poisoned(t, kAuditPoisonByte), 15);
  for (float v : t.to_floats()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(take_guard_violations().empty());
  // One float past the end, as a kernel without a tail check would write.
  static_cast<float*>(t.data_ptr())[15] = 1.0f;
  const auto v = take_guard_violations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].before);
  EXPECT_NE(v[0].describe().find("past its end"), std::string::npos);
  // Outside an audit, allocations are neither poisoned nor tracked.
  Tensor plain = Tensor::zeros({4}, DType::f32);
  EXPECT_EQ(count_poisoned(plain, kAuditPoisonByte), 0);
}

TEST(AllocationAudit, ViolationFoundWhenTheBlockIsFreed) {
  (void)take_guard_violations();
  {
    Tensor t;
    {
      AllocationAudit audit;
      t = Tensor::empty({8}, DType::bf16);
    }
    static_cast<unsigned char*>(t.data_ptr())[-1] = 0;  // one byte before the start
  }
  const auto v = take_guard_violations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(v[0].before);
}

TEST(AllocationAudit, DoesNotNest) {
  AllocationAudit a;
  EXPECT_THROW(AllocationAudit b, Error);
}

TEST(Compare, RmsScaledToleranceAndExactModes) {
  const Tensor e = Tensor::from_floats({1.0f, -2.0f, 0.0f, 4.0f}, {2, 2});
  Tensor a = Tensor::from_floats({1.01f, -2.0f, 0.001f, 4.0f}, {2, 2});
  // rms(e) = sqrt(21/4) ~ 2.29: atol = 0.01 * 2.29 covers both small differences.
  EXPECT_EQ(compare_close(a, e, {0.01, 0.01, 0}).bad, 0);
  const CompareStats s = compare_close(a, e, {1e-3, 0, 0});
  EXPECT_EQ(s.bad, 2);
  EXPECT_EQ(s.first_bad, 0);
  EXPECT_EQ(unravel_index({2, 2}, 2), "[1, 0]");
  EXPECT_EQ(compare_close(a, e, {}).bad, 2);  // exact
  Tensor n = Tensor::from_floats({NAN, -2.0f, 0.0f, 4.0f}, {2, 2});
  const CompareStats sn = compare_close(n, e, {1.0, 1.0, 0});
  EXPECT_EQ(sn.nan_actual, 1);
  EXPECT_EQ(sn.bad, 1);
  EXPECT_EQ(compare_close(Tensor::from_i32({1, 2, 3}, {3}), Tensor::from_i32({1, 2, 4}, {3}), {1, 1, 1}).bad, 1);
  int64_t first = -1;
  EXPECT_EQ(count_bitwise_mismatches(a, e, &first), 2);
  EXPECT_EQ(first, 0);
  EXPECT_THROW(compare_close(a, Tensor::from_floats({1, 2, 3, 4}, {4}), {}), Error);
}

using test::WrappedOp;  // the CPU baseline op with another forward (tests/wrapped_op.h)

struct Fixture {
  bench::BenchCase c;
  const OpEntry* entry = nullptr;
  std::unique_ptr<AnyOp> make() {
    OpArgs a = c.args;
    a.opts = ParamOptions{c.dtype, Device::cpu()};
    auto op = entry->make(a);
    init_random_weights(op->module(), 1, 0.02);
    return op;
  }
};

Fixture rms_fixture() {
  const ModelConfig cfg = ModelConfig::load(std::string(KBN_SOURCE_DIR) + "/models/tiny-llama.json");
  bench::CaseOptions o;
  o.tokens = {6};
  Fixture f;
  f.c = bench::cases_for("rms_norm", bench::model_view("tiny-llama", cfg, 1), o).at(0);
  f.entry = &registry(Variant::baseline).get("rms_norm");
  return f;
}

bench::Validation run(WrappedOp::Hook hook) {
  Fixture f = rms_fixture();
  auto base = f.make();
  WrappedOp cand(f.make(), std::move(hook));
  auto oracle = f.make();
  bench::ValidationOptions vo;
  vo.seeds = 2;
  return bench::validate_candidate(f.c, *f.entry, *base, cand, oracle.get(), Device::cpu(), 3, vo);
}

TEST(Validate, HonestPassesAndEachMisbehaviourNamesItsCheck) {
  EXPECT_TRUE(run([](AnyOp& op, const std::vector<Tensor>& a) { return op.call(a); }).pass);

  const auto half = run([](AnyOp& op, const std::vector<Tensor>& a) {
    Tensor out = Tensor::empty(a[0].shape(), a[0].dtype());
    std::vector<Tensor> r = op.call(a);
    out.slice(0, 0, 3).copy_(r[0].slice(0, 0, 3));
    return std::vector<Tensor>{out};
  });
  EXPECT_EQ(half.check, "unwritten");

  const auto scratch_in_input = run([](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    Tensor x = a[0];
    x.fill_(0.0);
    return r;
  });
  EXPECT_EQ(scratch_in_input.check, "immutable");

  const auto scaled = run([](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    Tensor y = Tensor::from_floats(r[0].to_floats(), r[0].shape(), r[0].dtype());
    std::vector<float> v = y.to_floats();
    for (float& x : v) x *= 1.1f;
    return std::vector<Tensor>{Tensor::from_floats(v, y.shape(), y.dtype())};
  });
  EXPECT_EQ(scaled.check, "tolerance");

  // Within the tolerance but consistently off: the precision budget against the oracle catches it.
  const auto biased = run([](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    std::vector<float> v = r[0].to_floats();
    for (float& x : v) x *= 1.008f;
    return std::vector<Tensor>{Tensor::from_floats(v, r[0].shape(), DType::f32).to(r[0].dtype())};
  });
  EXPECT_EQ(biased.check, "precision");

  Tensor keep;
  const auto reuse = run([&keep](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    if (!keep.defined() || keep.shape() != r[0].shape()) keep = Tensor::empty(r[0].shape(), r[0].dtype());
    keep.copy_(r[0]);
    return std::vector<Tensor>{keep};  // the same buffer every call
  });
  EXPECT_EQ(reuse.check, "fresh output");

  int calls = 0;
  const auto flaky = run([&calls](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    if (++calls >= 2) {  // every call after the first drifts a little further
      const float drift = 1e-2f * float(calls);
      std::vector<float> v = r[0].to_floats();
      v[0] += drift * std::max(1.0f, std::abs(v[0]));
      r[0] = Tensor::from_floats(v, r[0].shape(), DType::f32).to(r[0].dtype());
    }
    return r;
  });
  EXPECT_EQ(flaky.check, "determinism");

  const auto past_end = run([](AnyOp& op, const std::vector<Tensor>& a) {
    std::vector<Tensor> r = op.call(a);
    Tensor out = Tensor::empty(r[0].shape(), r[0].dtype());
    out.copy_(r[0]);
    static_cast<unsigned char*>(out.data_ptr())[out.nbytes() + 3] = 7;
    return std::vector<Tensor>{out};
  });
  EXPECT_EQ(past_end.check, "guards");
}

TEST(Validate, DistributionsChangeFloatsOnly) {
  std::vector<Tensor> in{Tensor::from_floats(std::vector<float>(8, 1.0f), {4, 2}), Tensor::from_i64({1, 2}, {2})};
  const auto large = bench::apply_distribution(in, "large", 1);
  EXPECT_FLOAT_EQ(large[0].to_floats()[0], 64.0f);
  EXPECT_EQ(large[1].to_ints(), (std::vector<int64_t>{1, 2}));
  const auto sparse = bench::apply_distribution(in, "sparse", 1);
  EXPECT_EQ(sparse[0].to_floats(), (std::vector<float>{0, 0, 1, 1, 0, 0, 1, 1}));
  EXPECT_THROW(bench::apply_distribution(in, "uniform", 1), Error);
}

}  // namespace

namespace {

class CountingOp : public AnyOp {
 public:
  explicit CountingOp(std::unique_ptr<AnyOp> inner) : inner_(std::move(inner)) {}
  Module& module() override { return inner_->module(); }
  std::vector<Tensor> call(const std::vector<Tensor>& args) override {
    calls++;
    return inner_->call(args);
  }
  int calls = 0;

 private:
  std::unique_ptr<AnyOp> inner_;
};

// kb_nano profile skips the calls validation and warm-up make before the first timed call; the count it uses
// must follow bench/validate.cpp and the timing warm-up.
TEST(Validate, CallsBeforeTimingMatchWhatProfileSkips) {
  for (const int seeds : {1, 2}) {
    Fixture f = rms_fixture();
    CountingOp base(f.make()), cand(f.make());
    auto oracle = f.make();
    bench::ValidationOptions vo;
    vo.seeds = seeds;
    ASSERT_TRUE(bench::validate_candidate(f.c, *f.entry, base, cand, oracle.get(), Device::cpu(), 3, vo).pass);
    const int warmup = bench::TimingOptions{}.warmup_calls;
    EXPECT_EQ(cand.calls + warmup, bench::calls_before_timing(f.c.input_bytes, true, seeds));
    EXPECT_EQ(base.calls + cand.calls + warmup, bench::calls_before_timing(f.c.input_bytes, false, seeds));
  }
}

}  // namespace
