// MambaChunkScanCombined's op layer on CPU tensors: every refused argument is named, and the slot handling around the
// oracle (which takes per-sequence states) is right: slots no sequence lists keep their bytes, a sequence without an
// initial state ignores whatever its slot holds (NaN included), and a sequence scanned in two calls (chunked prefill,
// the second starting from the first's final state) ends where one call ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "L1/mamba_chunk_scan_combined.h"
#include "kbn/rng.h"
#include "test_errors.h"

namespace {

using namespace kbn;
using namespace kbn::baseline;
using kbn::test::error_of;

Tensor randn(const Shape& s, uint64_t seed, double scale = 1.0, DType dt = DType::f32) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal_(t, seed, 0.0, scale);
  return dt == DType::f32 ? t : t.to(dt);
}

Tensor i32(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {int64_t(v.size())}); }

// A scan's inputs: 3 sequences of 1, 9 and 21 tokens (chunk 8: partial chunks, a one-token sequence), 4 heads over 2
// groups, head_dim 16, state_size 32, five slots of which sequences use 3, 0 and 4.
struct Inputs {
  int64_t H = 4, P = 16, G = 2, N = 32, slots = 5;
  std::vector<int32_t> q = {0, 1, 10, 31};
  Tensor x, dt, A, B, C, D, dt_bias, state, has_init, idx, qsl;
  explicit Inputs(uint64_t seed, DType dtype = DType::f32) {
    const int64_t T = q.back();
    x = randn({T, H, P}, seed, 1.0, dtype);
    dt = randn({T, H}, seed + 1, 1.0, dtype);
    A = Tensor::from_floats({-0.5f, -1.0f, -2.0f, -0.1f}, {H});
    B = randn({T, G, N}, seed + 2, 1.0, dtype);
    C = randn({T, G, N}, seed + 3, 1.0, dtype);
    D = Tensor::from_floats({0.5f, -1.0f, 0.25f, 0.0f}, {H});
    dt_bias = randn({H}, seed + 4, 0.3);
    state = randn({slots, H, P, N}, seed + 5, 1.0, dtype);
    has_init = i32({1, 0, 1});
    idx = i32({3, 0, 4});
    qsl = i32(q);
  }
  Tensor run(MambaChunkScanCombined& op) const {
    return op.forward(x, dt, A, B, C, D, dt_bias, state, has_init, idx, qsl);
  }
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

TEST(MambaChunkScanCombined, ConstructorRefusesBadChunksAndTimeStepLimits) {
  for (int64_t L : {0, 4, 12, 512})
    EXPECT_NE(error_of([&] { MambaChunkScanCombined op(L); }).find("'chunk_size'"), std::string::npos) << L;
  EXPECT_NE(error_of([] { MambaChunkScanCombined op(8, true, -0.1); }).find("'dt_min'"), std::string::npos);
  EXPECT_NE(error_of([] { MambaChunkScanCombined op(8, true, 0.2, 0.1); }).find("'dt_max'"), std::string::npos);
  EXPECT_NO_THROW(MambaChunkScanCombined(8));
  EXPECT_NO_THROW(MambaChunkScanCombined(256, false, 0.001, 0.1));
}

TEST(MambaChunkScanCombined, NamesEveryArgumentItRefuses) {
  MambaChunkScanCombined op(8);
  struct Bad {
    std::string arg;
    std::function<void(Inputs&)> spoil;
  };
  const std::vector<Bad> bad = {
      {"'x'",
       [](Inputs& in) {
         in.x = in.x.view({31, 4 * 16});
       }},  // rank
      {"'x'",
       [](Inputs& in) {
         in.x = Tensor::zeros({31, 4, 16}, DType::i32);
       }},  // dtype
      {"'x'",
       [](Inputs& in) {
         in.x = randn({31, 4, 24}, 1);
       }},  // head_dim 24
      {"'x'",
       [](Inputs& in) {
         in.x = randn({31, 16, 4}, 1).transpose(1, 2);
       }},                                           // heads not packed
      {"'x'", [](Inputs& in) { in.x = Tensor(); }},  // undefined
      {"'dt'",
       [](Inputs& in) {
         in.dt = randn({30, 4}, 1);
       }},  // num_tokens
      {"'dt'",
       [](Inputs& in) {
         in.dt = randn({31, 3}, 1);
       }},  // num_heads
      {"'dt'",
       [](Inputs& in) {
         in.dt = randn({31, 4}, 1, 1.0, DType::bf16);
       }},  // dtype of x
      {"'dt'",
       [](Inputs& in) {
         in.dt = randn({4, 31}, 1).transpose(0, 1);
       }},                                           // heads not packed
      {"'A'", [](Inputs& in) { in.A = Tensor(); }},  // undefined
      {"'A'",
       [](Inputs& in) {
         in.A = Tensor::from_floats({-1.f, -1.f, -1.f}, {3});
       }},                                                       // size
      {"'A'", [](Inputs& in) { in.A = in.A.to(DType::bf16); }},  // dtype
      {"'D'",
       [](Inputs& in) {
         in.D = Tensor::from_floats({1.f, 1.f}, {2});
       }},                                                                        // size
      {"'dt_bias'", [](Inputs& in) { in.dt_bias = in.dt_bias.to(DType::f16); }},  // dtype
      {"'B'",
       [](Inputs& in) {
         in.B = randn({31, 3, 32}, 1);
       }},  // groups divide heads
      {"'B'",
       [](Inputs& in) {
         in.B = randn({31, 2, 48}, 1);
       }},  // state_size 48
      {"'B'",
       [](Inputs& in) {
         in.B = randn({30, 2, 32}, 1);
       }},  // num_tokens
      {"'B'",
       [](Inputs& in) {
         in.B = randn({31, 32, 2}, 1).transpose(1, 2);
       }},  // groups not packed
      {"'C'",
       [](Inputs& in) {
         in.C = randn({31, 1, 32}, 1);
       }},                                                      // shape of B
      {"'C'", [](Inputs& in) { in.C = in.C.to(DType::f16); }},  // dtype of x
      {"'state'",
       [](Inputs& in) {
         in.state = randn({5, 4, 16, 16}, 1);
       }},  // state_size
      {"'state'",
       [](Inputs& in) {
         in.state = randn({5, 4, 16}, 1);
       }},  // rank
      {"'state'",
       [](Inputs& in) {
         in.state = Tensor::zeros({5, 4, 16, 32}, DType::i32);
       }},  // dtype
      {"'state'",
       [](Inputs& in) {
         in.state = randn({5, 4, 32, 16}, 1).transpose(2, 3);
       }},  // contiguous
      {"'state_indices'",
       [](Inputs& in) {
         in.idx = i32({3, 0});
       }},  // num_seqs
      {"'state_indices'",
       [](Inputs& in) {
         in.idx = i32({3, 5, 4});
       }},  // not a slot
      {"'state_indices'",
       [](Inputs& in) {
         in.idx = i32({3, 3, 4});
       }},  // twice
      {"'state_indices'",
       [](Inputs& in) {
         in.idx = Tensor::from_i64({3, 0, 4}, {3});
       }},  // i32
      {"'has_initial_state'",
       [](Inputs& in) {
         in.has_init = i32({1, 0});
       }},  // num_seqs
      {"'has_initial_state'",
       [](Inputs& in) {
         in.has_init = Tensor::from_i64({1, 0, 1}, {3});
       }},
      {"'query_start_loc'",
       [](Inputs& in) {
         in.qsl = i32({0, 1, 10, 30});
       }},  // does not end at num_tokens
      {"'query_start_loc'",
       [](Inputs& in) {
         in.qsl = i32({0, 11, 10, 31});
       }},  // decreases
      {"'query_start_loc'",
       [](Inputs& in) {
         in.qsl = Tensor::from_i64({0, 1, 10, 31}, {4});
       }},
  };
  for (const Bad& b : bad) {
    Inputs in(7);
    b.spoil(in);
    const std::string e = error_of([&] { in.run(op); });
    EXPECT_NE(e.find("mamba_chunk_scan_combined"), std::string::npos) << e;
    EXPECT_NE(e.find(b.arg), std::string::npos) << "expected " << b.arg << " named in: " << e;
  }
}

TEST(MambaChunkScanCombined, LeavesUnlistedSlotsAlone) {
  MambaChunkScanCombined op(8);
  for (DType dt : {DType::f32, DType::bf16}) {
    Inputs in(11, dt);
    const Tensor before = in.state.clone();
    (void)in.run(op);
    for (int64_t slot : {1, 2}) EXPECT_TRUE(bitwise_equal(in.state.select(0, slot), before.select(0, slot))) << slot;
    for (int64_t slot : {0, 3, 4})
      EXPECT_FALSE(bitwise_equal(in.state.select(0, slot), before.select(0, slot))) << slot << " was not written";
  }
}

TEST(MambaChunkScanCombined, IgnoresTheSlotOfASequenceWithoutInitialState) {
  MambaChunkScanCombined op(8);
  Inputs a(13), b(13);
  // Sequence 1 (slot 0) starts fresh: NaN or zeros in its slot give the same outputs and final state.
  a.state.select(0, 0).fill_(std::numeric_limits<double>::quiet_NaN());
  b.state.select(0, 0).zero_();
  const Tensor ya = a.run(op), yb = b.run(op);
  EXPECT_TRUE(bitwise_equal(ya, yb));
  EXPECT_TRUE(bitwise_equal(a.state, b.state));
  for (double v : ya.to_doubles()) ASSERT_TRUE(std::isfinite(v));
  // ...whereas a sequence with an initial state reads it: zeroing slot 3 (sequence 0's) changes its token.
  Inputs c(13);
  c.state.select(0, 3).zero_();
  const Tensor yc = c.run(op);
  EXPECT_GT(max_abs_diff(yc.slice(0, 0, 1), yb.slice(0, 0, 1)), 1e-3);
  EXPECT_TRUE(bitwise_equal(yc.slice(0, 1, 31), yb.slice(0, 1, 31)));
}

TEST(MambaChunkScanCombined, TwoCallsChainLikeOne) {
  // Sequence 2 (21 tokens, slot 4) split after 6 and after 13 tokens: the second call starts from the first's final
  // state in the same slot. Outputs and final states equal the single call's (the oracle's rounding aside).
  MambaChunkScanCombined op(8);
  for (int64_t cut : {6, 8, 13}) {
    Inputs one(17);
    const Tensor y = one.run(op);
    Inputs two(17);
    auto rows = [](const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b).contiguous(); };
    const int64_t s1 = 10 + cut, end = 31;
    // First call: sequences 0 and 1 whole, and the first `cut` tokens of sequence 2.
    const Tensor qa = i32({0, 1, 10, int32_t(s1)});
    const Tensor ya =
        MambaChunkScanCombined(8).forward(rows(two.x, 0, s1), rows(two.dt, 0, s1), two.A, rows(two.B, 0, s1),
                                          rows(two.C, 0, s1), two.D, two.dt_bias, two.state, two.has_init, two.idx, qa);
    // Second call: the rest of sequence 2, continuing from slot 4.
    const Tensor yb =
        op.forward(rows(two.x, s1, end), rows(two.dt, s1, end), two.A, rows(two.B, s1, end), rows(two.C, s1, end),
                   two.D, two.dt_bias, two.state, i32({1}), i32({4}), i32({0, int32_t(end - s1)}));
    EXPECT_LT(max_abs_diff(ya, rows(y, 0, s1)), 1e-5) << cut;
    EXPECT_LT(max_abs_diff(yb, rows(y, s1, end)), 1e-5) << cut;
    EXPECT_LT(max_abs_diff(two.state, one.state), 1e-5) << cut;
  }
}

TEST(MambaChunkScanCombined, NoSequenceNoTokens) {
  MambaChunkScanCombined op(8);
  Inputs in(3);
  const Tensor before = in.state.clone();
  const Tensor empty3 = Tensor::empty({0, 4, 16}, DType::f32), empty2 = Tensor::empty({0, 4}, DType::f32);
  const Tensor bc = Tensor::empty({0, 2, 32}, DType::f32);
  const Tensor y = op.forward(empty3, empty2, in.A, bc, bc, in.D, in.dt_bias, in.state, i32({}), i32({}), i32({0}));
  EXPECT_EQ(y.shape(), (Shape{0, 4, 16}));
  EXPECT_TRUE(bitwise_equal(in.state, before));
}

}  // namespace
