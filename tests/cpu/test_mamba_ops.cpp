// Mamba-2's decode and conv ops on CPU tensors (causal_conv1d_fn, causal_conv1d_update, selective_state_update,
// mixer2_rms_norm_gated): every refused argument is named, the slot handling around the oracle is right (a sequence
// shorter than the conv's window carries part of its old state into the new one, a sequence without an initial state
// ignores whatever its slot holds, slots no sequence lists keep their bytes), the time step's clamp applies, and
// small cases computed by hand here (not by the oracle the CPU path calls) come out. The validation contract runs
// the four ops at tiny-mamba2's and Mamba-Codestral's shapes (the GPU twin is tests/gpu/test_mamba_gpu.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "L1/causal_conv1d_fn.h"
#include "L1/causal_conv1d_update.h"
#include "L1/linear.h"
#include "L1/mixer2_rms_norm_gated.h"
#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L1/selective_state_update.h"
#include "kbn/rng.h"
#include "mamba_contract.h"
#include "op_contract.h"
#include "test_errors.h"

namespace {

using namespace kbn;
using namespace kbn::baseline;
using kbn::test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Tensor randn(const Shape& s, uint64_t seed, double scale = 1.0, DType dt = DType::f32) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal_(t, seed, 0.0, scale);
  return dt == DType::f32 ? t : t.to(dt);
}

Tensor floats(const std::vector<float>& v, const Shape& shape) { return Tensor::from_floats(v, shape); }
Tensor i32(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {int64_t(v.size())}); }

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// ---- causal_conv1d_fn ----

// Three sequences (1, 2 and 6 tokens) over 5 channels, width 4, in slots 3, 0 and 2 of five.
struct ConvFnInputs {
  int64_t dim = 5, W = 4, slots = 5;
  std::vector<int32_t> q = {0, 1, 3, 9};
  Tensor x, weight, bias, states, has_init, idx, qsl;
  explicit ConvFnInputs(uint64_t seed) {
    x = randn({q.back(), dim}, seed);
    weight = randn({dim, W}, seed + 1, 0.5);
    bias = randn({dim}, seed + 2, 0.5);
    states = randn({slots, W - 1, dim}, seed + 3);
    has_init = i32({1, 0, 1});
    idx = i32({3, 0, 2});
    qsl = i32(q);
  }
  Tensor run(CausalConv1dFn& op) const { return op.forward(x, weight, bias, states, has_init, idx, qsl); }
};

TEST(CausalConv1dFn, NamesEveryArgumentItRefuses) {
  std::string msg = error_of([] { CausalConv1dFn("gelu"); });
  EXPECT_TRUE(contains(msg, "CausalConv1dFn") && contains(msg, "'activation'") && contains(msg, "gelu")) << msg;
  CausalConv1dFn op;
  auto expect = [&](const std::function<void(ConvFnInputs&)>& spoil, const std::string& arg, const std::string& what) {
    ConvFnInputs in(1);
    spoil(in);
    const std::string m = error_of([&] { in.run(op); });
    EXPECT_TRUE(contains(m, "causal_conv1d_fn") && contains(m, "'" + arg + "'") && contains(m, what))
        << "expected an error naming '" << arg << "' with \"" << what << "\", got: " << m;
  };
  expect([](ConvFnInputs& in) { in.x = randn({9, 5, 1}, 7); }, "x", "2-D");
  expect([](ConvFnInputs& in) { in.x = Tensor::zeros({9, 5}, DType::i32); }, "x", "dtype");
  expect([](ConvFnInputs& in) { in.weight = randn({5, 5}, 7); }, "weight", "supported: 2, 3, 4");
  expect([](ConvFnInputs& in) { in.weight = randn({4, 4}, 7); }, "weight", "dim");
  expect([](ConvFnInputs& in) { in.weight = randn({5, 4}, 7).to(DType::bf16); }, "weight", "same dtype");
  expect([](ConvFnInputs& in) { in.weight = randn({4, 5}, 7).transpose(0, 1); }, "weight", "contiguous");
  expect([](ConvFnInputs& in) { in.bias = randn({6}, 7); }, "bias", "dim");
  expect([](ConvFnInputs& in) { in.states = randn({5, 2, 5}, 7); }, "conv_states", "width - 1");
  expect([](ConvFnInputs& in) { in.states = randn({5, 3, 5}, 7, 1.0, DType::bf16); }, "conv_states", "same dtype");
  expect([](ConvFnInputs& in) { in.has_init = i32({1, 0}); }, "has_initial_state", "num_seqs");
  expect([](ConvFnInputs& in) { in.idx = Tensor::from_i64({3, 0, 2}, {3}); }, "cache_indices", "i32");
  expect([](ConvFnInputs& in) { in.idx = i32({3, 5, 2}); }, "cache_indices", "[1] = 5 is not a slot in [0, 5)");
  expect([](ConvFnInputs& in) { in.idx = i32({3, -1, 2}); }, "cache_indices", "[1] = -1");
  expect([](ConvFnInputs& in) { in.idx = i32({3, 0, 3}); }, "cache_indices", "slot 3 twice");
  expect([](ConvFnInputs& in) { in.qsl = i32({0, 1, 3, 8}); }, "query_start_loc", "from 0 to num_tokens (9)");
  expect([](ConvFnInputs& in) { in.qsl = i32({0, 3, 3, 9}); }, "query_start_loc", "at least one token");
  expect([](ConvFnInputs& in) { in.qsl = Tensor::from_i64({0, 1, 3, 9}, {4}); }, "query_start_loc", "i32");
  expect([](ConvFnInputs& in) { in.x = randn({2, 5}, 7); }, "x", "2 tokens for 3 sequences");
}

TEST(CausalConv1dFn, MatchesAHandComputedConvolution) {
  // One channel, taps [1, 2, 3, 4], bias 0.5, no activation; the slot holds the earlier inputs 10, 20, 30.
  // Windows [10 20 30 1], [20 30 1 2], [30 1 2 3] give 144.5, 91.5 and 50.5; the new state is [1, 2, 3].
  CausalConv1dFn op("");
  Tensor states = floats({10, 20, 30}, {1, 3, 1});
  const Tensor y = op.forward(floats({1, 2, 3}, {3, 1}), floats({1, 2, 3, 4}, {1, 4}), floats({0.5f}, {1}), states,
                              i32({1}), i32({0}), i32({0, 3}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{144.5f, 91.5f, 50.5f}));
  EXPECT_EQ(states.to_floats(), (std::vector<float>{1, 2, 3}));
  // With silu, and without the initial state: windows [0 0 0 1], [0 0 1 2], [0 1 2 3] give 4.5, 11.5, 20.5.
  CausalConv1dFn act("silu");
  Tensor fresh = floats({10, 20, 30}, {1, 3, 1});
  const std::vector<float> z = act.forward(floats({1, 2, 3}, {3, 1}), floats({1, 2, 3, 4}, {1, 4}), floats({0.5f}, {1}),
                                           fresh, i32({0}), i32({0}), i32({0, 3}))
                                   .to_floats();
  EXPECT_NEAR(z[0], silu(4.5), 1e-5);
  EXPECT_NEAR(z[1], silu(11.5), 1e-5);
  EXPECT_NEAR(z[2], silu(20.5), 1e-5);
  EXPECT_EQ(fresh.to_floats(), (std::vector<float>{1, 2, 3}));
}

TEST(CausalConv1dFn, AShortSequenceCarriesItsOldStateIntoTheNewOne) {
  // Width 4 keeps 3 earlier inputs: a 1-token sequence's new state is [old[1], old[2], x0], a 2-token one's
  // [old[2], x0, x1]. Computed here from the inputs, not by the oracle.
  ConvFnInputs in(11);
  const Tensor before = in.states.clone();
  CausalConv1dFn op;
  const Tensor y = in.run(op);
  const std::vector<double> old = before.to_doubles(), now = in.states.to_doubles(), x = in.x.to_doubles();
  const int64_t dim = in.dim, H = in.W - 1;
  auto at = [&](const std::vector<double>& st, int64_t slot, int64_t k, int64_t c) {
    return st[size_t((slot * H + k) * dim + c)];
  };
  for (int64_t c = 0; c < dim; ++c) {
    // Sequence 0: one token, slot 3, with its initial state.
    EXPECT_EQ(at(now, 3, 0, c), at(old, 3, 1, c));
    EXPECT_EQ(at(now, 3, 1, c), at(old, 3, 2, c));
    EXPECT_EQ(at(now, 3, 2, c), x[size_t(0 * dim + c)]);
    // Sequence 1: two tokens, slot 0, no initial state: zeros shift in front.
    EXPECT_EQ(at(now, 0, 0, c), 0.0);
    EXPECT_EQ(at(now, 0, 1, c), x[size_t(1 * dim + c)]);
    EXPECT_EQ(at(now, 0, 2, c), x[size_t(2 * dim + c)]);
    // Sequence 2: six tokens, slot 2: its last three inputs.
    for (int64_t k = 0; k < H; ++k) EXPECT_EQ(at(now, 2, k, c), x[size_t((6 + k) * dim + c)]);
  }
  // Slots 1 and 4 are no sequence's: untouched.
  for (int64_t slot : {1, 4})
    EXPECT_TRUE(bitwise_equal(in.states.slice(0, slot, slot + 1), before.slice(0, slot, slot + 1))) << slot;
  // The first output of sequence 0 reads the old state: bias + w . [old[0], old[1], old[2], x0], then silu.
  const std::vector<double> w = in.weight.to_doubles(), bias = in.bias.to_doubles(), yv = y.to_doubles();
  for (int64_t c = 0; c < dim; ++c) {
    double acc = bias[size_t(c)];
    for (int64_t k = 0; k < H; ++k) acc += w[size_t(c * in.W + k)] * at(old, 3, k, c);
    acc += w[size_t(c * in.W + H)] * x[size_t(c)];
    EXPECT_NEAR(yv[size_t(c)], silu(acc), 1e-5) << c;
  }
}

TEST(CausalConv1dFn, ASequenceWithoutInitialStateIgnoresItsSlot) {
  ConvFnInputs in(21);
  ConvFnInputs clean(21);
  // Slot 0 belongs to sequence 1 (no initial state): NaN there must not reach its outputs or its new state.
  in.states.slice(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  clean.states.slice(0, 0, 1).fill_(123.0);
  CausalConv1dFn op;
  const Tensor y = in.run(op), y_clean = clean.run(op);
  EXPECT_TRUE(bitwise_equal(y, y_clean));
  EXPECT_TRUE(bitwise_equal(in.states, clean.states));
  for (double v : in.states.to_doubles()) EXPECT_FALSE(std::isnan(v));
}

TEST(CausalConv1dFn, NoSequenceNoTokens) {
  ConvFnInputs in(3);
  const Tensor before = in.states.clone();
  const Tensor y = CausalConv1dFn().forward(Tensor::empty({0, 5}, DType::f32), in.weight, in.bias, in.states, i32({}),
                                            i32({}), i32({0}));
  EXPECT_EQ(y.shape(), (Shape{0, 5}));
  EXPECT_TRUE(bitwise_equal(in.states, before));
}

// ---- causal_conv1d_update ----

TEST(CausalConv1dUpdate, NamesEveryArgumentItRefuses) {
  std::string msg = error_of([] { CausalConv1dUpdate("relu"); });
  EXPECT_TRUE(contains(msg, "CausalConv1dUpdate") && contains(msg, "'activation'")) << msg;
  CausalConv1dUpdate op;
  const Tensor x = randn({2, 5}, 1), states = randn({4, 3, 5}, 2), w = randn({5, 4}, 3), b = randn({5}, 4);
  auto expect = [&](const std::function<void()>& call, const std::string& arg, const std::string& what) {
    const std::string m = error_of(call);
    EXPECT_TRUE(contains(m, "causal_conv1d_update") && contains(m, "'" + arg + "'") && contains(m, what))
        << "expected an error naming '" << arg << "' with \"" << what << "\", got: " << m;
  };
  expect([&] { op.forward(randn({5}, 1), states, w, b, i32({0, 1})); }, "x", "2-D");
  expect([&] { op.forward(x, randn({4, 3, 6}, 2), w, b, i32({0, 1})); }, "conv_states", "dim");
  expect([&] { op.forward(x, states, randn({5, 1}, 3), b, i32({0, 1})); }, "weight", "supported: 2, 3, 4");
  expect([&] { op.forward(x, states, w, randn({5}, 4, 1.0, DType::bf16), i32({0, 1})); }, "bias", "same dtype");
  expect([&] { op.forward(x, states, w, b, i32({0})); }, "conv_state_indices", "batch");
  expect([&] { op.forward(x, states, w, b, i32({0, 4})); }, "conv_state_indices", "[1] = 4 is not a slot in [0, 4)");
  expect([&] { op.forward(x, states, w, b, i32({2, 2})); }, "conv_state_indices", "slot 2 twice");
  expect([&] { op.forward(x, states, w, b, Tensor::from_i64({0, 1}, {2})); }, "conv_state_indices", "i32");
}

TEST(CausalConv1dUpdate, MatchesAHandComputedStepAndShiftsTheState) {
  // The slot holds 10, 20, 30; the new input 1: window [10 20 30 1] with taps [1 2 3 4] and bias 0.5 gives 144.5,
  // and the state becomes [20, 30, 1]. Slot 1 (no sequence's) keeps its values.
  Tensor states = floats({7, 8, 9, 10, 20, 30}, {2, 3, 1});
  const Tensor y = CausalConv1dUpdate("").forward(floats({1}, {1, 1}), states, floats({1, 2, 3, 4}, {1, 4}),
                                                  floats({0.5f}, {1}), i32({1}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{144.5f}));
  EXPECT_EQ(states.to_floats(), (std::vector<float>{7, 8, 9, 20, 30, 1}));
  // Width 2 keeps one earlier input: slot 0 holds 7, the new input is 5, taps [2, 3], no bias: silu(2 * 7 + 3 * 5);
  // the state becomes [5].
  Tensor s2 = floats({7, 20}, {2, 1, 1});
  const std::vector<float> z =
      CausalConv1dUpdate().forward(floats({5}, {1, 1}), s2, floats({2, 3}, {1, 2}), Tensor(), i32({0})).to_floats();
  EXPECT_NEAR(z[0], silu(29.0), 1e-4);
  EXPECT_EQ(s2.to_floats(), (std::vector<float>{5, 20}));
}

// ---- selective_state_update ----

struct SsuInputs {
  int64_t H = 4, P = 3, G = 2, N = 8, slots = 4, batch = 2;
  Tensor state, x, dt, A, B, C, D, dt_bias, idx;
  explicit SsuInputs(uint64_t seed) {
    state = randn({slots, H, P, N}, seed);
    x = randn({batch, H, P}, seed + 1);
    dt = randn({batch, H}, seed + 2);
    A = floats({-0.5f, -1.0f, -2.0f, -4.0f}, {H});
    B = randn({batch, G, N}, seed + 3);
    C = randn({batch, G, N}, seed + 4);
    D = floats({0.5f, -1.0f, 0.25f, 0.0f}, {H});
    dt_bias = randn({H}, seed + 5, 0.3);
    idx = i32({2, 0});
  }
  Tensor run(SelectiveStateUpdate& op) const { return op.forward(state, x, dt, A, B, C, D, dt_bias, idx); }
};

TEST(SelectiveStateUpdate, NamesEveryArgumentItRefuses) {
  std::string msg = error_of([] { SelectiveStateUpdate(true, 0.5, 0.1); });
  EXPECT_TRUE(contains(msg, "SelectiveStateUpdate") && contains(msg, "'dt_min'") && contains(msg, "'dt_max'")) << msg;
  msg = error_of([] { SelectiveStateUpdate(true, std::nan(""), 1.0); });
  EXPECT_TRUE(contains(msg, "'dt_min'")) << msg;
  SelectiveStateUpdate op;
  auto expect = [&](const std::function<void(SsuInputs&)>& spoil, const std::string& arg, const std::string& what) {
    SsuInputs in(1);
    spoil(in);
    const std::string m = error_of([&] { in.run(op); });
    EXPECT_TRUE(contains(m, "selective_state_update") && contains(m, "'" + arg + "'") && contains(m, what))
        << "expected an error naming '" << arg << "' with \"" << what << "\", got: " << m;
  };
  expect([](SsuInputs& in) { in.x = randn({2, 12}, 7); }, "x", "3-D");
  expect([](SsuInputs& in) { in.x = randn({2, 3, 4}, 7).transpose(1, 2); }, "x", "packed");
  expect([](SsuInputs& in) { in.state = randn({4, 4, 3}, 7); }, "state", "4-D");
  expect([](SsuInputs& in) { in.state = randn({4, 4, 5, 8}, 7); }, "state", "head_dim");
  expect([](SsuInputs& in) { in.state = randn({4, 5, 3, 8}, 7); }, "state", "num_heads");
  expect([](SsuInputs& in) { in.state = randn({4, 4, 3, 16}, 7).slice(3, 0, 8); }, "state", "contiguous");
  expect([](SsuInputs& in) { in.dt = randn({2, 5}, 7); }, "dt", "num_heads");
  expect([](SsuInputs& in) { in.dt = randn({2, 4}, 7, 1.0, DType::bf16); }, "dt", "same dtype");
  expect([](SsuInputs& in) { in.A = in.A.to(DType::bf16); }, "A", "f32");
  expect([](SsuInputs& in) { in.B = randn({2, 2, 7}, 7); }, "B", "state_size");
  expect([](SsuInputs& in) { in.C = randn({2, 1, 8}, 7); }, "C", "n_groups");
  expect(
      [](SsuInputs& in) {
        in.B = randn({2, 3, 8}, 7);
        in.C = randn({2, 3, 8}, 8);
      },
      "B", "multiple of n_groups");
  expect([](SsuInputs& in) { in.D = floats({1, 2, 3}, {3}); }, "D", "num_heads");
  expect([](SsuInputs& in) { in.dt_bias = Tensor::zeros({4}, DType::f16); }, "dt_bias", "f32");
  expect([](SsuInputs& in) { in.idx = i32({2, 4}); }, "state_batch_indices", "[1] = 4 is not a slot in [0, 4)");
  expect([](SsuInputs& in) { in.idx = i32({1, 1}); }, "state_batch_indices", "slot 1 twice");
  expect([](SsuInputs& in) { in.idx = Tensor::from_i64({2, 0}, {2}); }, "state_batch_indices", "i32");
}

TEST(SelectiveStateUpdate, MatchesAHandComputedUpdateAndClampsTheTimeStep) {
  // One head, one channel, one state value: S = 2, x = 3, B = 0.5, C = 4, A = -1, D = 0.25, dt + dt_bias = 1.
  //   dt' = softplus(1) = ln(1 + e); S' = exp(-dt') 2 + dt' 3 0.5; out = 4 S' + 0.75.
  auto run = [](SelectiveStateUpdate& op, double* new_state) {
    Tensor state = floats({9, 2}, {2, 1, 1, 1});  // slot 1 is the sequence's
    const Tensor y =
        op.forward(state, floats({3}, {1, 1, 1}), floats({0.75f}, {1, 1}), floats({-1}, {1}), floats({0.5f}, {1, 1, 1}),
                   floats({4}, {1, 1, 1}), floats({0.25f}, {1}), floats({0.25f}, {1}), i32({1}));
    EXPECT_EQ(state.to_floats()[0], 9.f);  // slot 0 untouched
    *new_state = state.to_doubles()[1];
    return y.to_doubles()[0];
  };
  auto expected = [](double d, double* s) {
    *s = std::exp(-d) * 2 + d * 3 * 0.5;
    return 4 * *s + 0.75;
  };
  double s = 0, want_s = 0;
  SelectiveStateUpdate plain;
  double y = run(plain, &s), want = expected(std::log1p(std::exp(1.0)), &want_s);
  EXPECT_NEAR(y, want, 1e-5);
  EXPECT_NEAR(s, want_s, 1e-6);
  // A finite dt_max clamps softplus(1) = 1.313 to 0.1 (Mamba-2's time_step_limit).
  SelectiveStateUpdate capped(true, 0.0, 0.1);
  y = run(capped, &s);
  want = expected(0.1, &want_s);
  EXPECT_NEAR(y, want, 1e-5);
  EXPECT_NEAR(s, want_s, 1e-6);
  // dt_min raises it: without softplus dt' = 1, clamped up to 1.5.
  SelectiveStateUpdate floor(false, 1.5, 10.0);
  y = run(floor, &s);
  want = expected(1.5, &want_s);
  EXPECT_NEAR(y, want, 1e-5);
  EXPECT_NEAR(s, want_s, 1e-6);
}

TEST(SelectiveStateUpdate, UpdatesOnlyTheListedSlotsAndTakesStridedViews) {
  SsuInputs in(31);
  const Tensor before = in.state.clone();
  // x, dt, B and C as views of one [batch, 12 + 4 + 16 + 16 + 5] activation row (token stride free).
  const int64_t row = 12 + 4 + 16 + 16 + 5;
  Tensor act = randn({2, row}, 41);
  act.as_strided({2, 4, 3}, {row, 3, 1}, 0).copy_(in.x);
  act.as_strided({2, 4}, {row, 1}, 12).copy_(in.dt);
  act.as_strided({2, 2, 8}, {row, 8, 1}, 16).copy_(in.B);
  act.as_strided({2, 2, 8}, {row, 8, 1}, 32).copy_(in.C);
  SsuInputs views = in;
  views.state = before.clone();
  views.x = act.as_strided({2, 4, 3}, {row, 3, 1}, 0);
  views.dt = act.as_strided({2, 4}, {row, 1}, 12);
  views.B = act.as_strided({2, 2, 8}, {row, 8, 1}, 16);
  views.C = act.as_strided({2, 2, 8}, {row, 8, 1}, 32);
  SelectiveStateUpdate op;
  const Tensor y = in.run(op), yv = views.run(op);
  EXPECT_TRUE(bitwise_equal(y, yv));
  EXPECT_TRUE(bitwise_equal(in.state, views.state));
  for (int64_t slot : {1, 3})
    EXPECT_TRUE(bitwise_equal(in.state.slice(0, slot, slot + 1), before.slice(0, slot, slot + 1))) << slot;
  EXPECT_FALSE(bitwise_equal(in.state.slice(0, 2, 3), before.slice(0, 2, 3)));
  // Without D and dt_bias (zeros).
  SsuInputs none(31);
  none.D = Tensor();
  none.dt_bias = Tensor();
  SsuInputs zeros(31);
  zeros.D = Tensor::zeros({4}, DType::f32);
  zeros.dt_bias = Tensor::zeros({4}, DType::f32);
  EXPECT_TRUE(bitwise_equal(none.run(op), zeros.run(op)));
}

// ---- mixer2_rms_norm_gated ----

TEST(Mixer2RmsNormGated, NormalisesEachGroupOfTheGatedInput) {
  // Two groups of two: y = x * silu(gate), each group divided by its own rms, scaled by the weight.
  Mixer2RMSNormGated norm(4, 2, 1e-6);
  EXPECT_EQ(norm.weight.to_floats(), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(norm.group_size(), 2);
  norm.weight.copy_(floats({1, 2, 0.5f, -1}, {4}));
  const std::vector<double> x = {1, -2, 3, 0.5}, g = {0.5, 1, -1, 2};
  const std::vector<float> out =
      norm.forward(floats({1, -2, 3, 0.5f}, {1, 4}), floats({0.5f, 1, -1, 2}, {1, 4})).to_floats();
  const std::vector<double> w = {1, 2, 0.5, -1};
  for (int grp = 0; grp < 2; ++grp) {
    const double y0 = x[size_t(2 * grp)] * silu(g[size_t(2 * grp)]);
    const double y1 = x[size_t(2 * grp + 1)] * silu(g[size_t(2 * grp + 1)]);
    const double inv = 1.0 / std::sqrt((y0 * y0 + y1 * y1) / 2 + 1e-6);
    EXPECT_NEAR(out[size_t(2 * grp)], y0 * inv * w[size_t(2 * grp)], 1e-5);
    EXPECT_NEAR(out[size_t(2 * grp + 1)], y1 * inv * w[size_t(2 * grp + 1)], 1e-5);
  }
}

TEST(Mixer2RmsNormGated, TakesAStridedGate) {
  Mixer2RMSNormGated norm(64, 4);
  norm.weight.copy_(randn({64}, 5));
  const Tensor x = randn({3, 64}, 6);
  const Tensor proj = randn({3, 64 + 40}, 7);
  const Tensor gate = proj.slice(1, 0, 64);
  EXPECT_TRUE(bitwise_equal(norm.forward(x, gate), norm.forward(x, gate.contiguous())));
}

TEST(Mixer2RmsNormGated, NamesEveryArgumentItRefuses) {
  std::string msg = error_of([] { Mixer2RMSNormGated(10, 3); });
  EXPECT_TRUE(contains(msg, "Mixer2RMSNormGated") && contains(msg, "'n_groups'")) << msg;
  msg = error_of([] { Mixer2RMSNormGated(0, 1); });
  EXPECT_TRUE(contains(msg, "'hidden_size'")) << msg;
  msg = error_of([] { Mixer2RMSNormGated(8, 2, 0.0); });
  EXPECT_TRUE(contains(msg, "'eps'")) << msg;
  Mixer2RMSNormGated norm(8, 2);
  msg = error_of([&] { norm.forward(randn({2, 7}, 1), randn({2, 7}, 2)); });
  EXPECT_TRUE(contains(msg, "mixer2_rms_norm_gated") && contains(msg, "'x'") && contains(msg, "hidden_size")) << msg;
  msg = error_of([&] { norm.forward(randn({2, 8}, 1), randn({3, 8}, 2)); });
  EXPECT_TRUE(contains(msg, "'gate'") && contains(msg, "num_tokens")) << msg;
  msg = error_of([&] { norm.forward(randn({2, 8}, 1), randn({2, 8}, 2, 1.0, DType::bf16)); });
  EXPECT_TRUE(contains(msg, "'gate'") && contains(msg, "same dtype")) << msg;
  msg = error_of([&] { norm.forward(randn({2, 8}, 1, 1.0, DType::bf16), randn({2, 8}, 2, 1.0, DType::bf16)); });
  EXPECT_TRUE(contains(msg, "'weight'")) << msg;
  msg = error_of([&] { norm.forward(randn({2, 16}, 1).as_strided({2, 8}, {16, 2}, 0), randn({2, 8}, 2)); });
  EXPECT_TRUE(contains(msg, "'x'") && contains(msg, "stride 1")) << msg;
}

// ---- the validation contract at the models' shapes ----

// ---- rms_norm_gemv with Mamba-2's fp32 residual stream (the decoder layer's one-token norm + in_proj) ----

// h = x + residual stays fp32 (not rounded to x's bf16), the output is RMSNorm's fp32-residual norm then Linear, and
// GemmaRMSNorm's offset, which no fp32-residual model has, is refused by name.
TEST(RMSNormGemvF32Residual, KeepsTheSumInFp32AndGivesTheSeparateOps) {
  const int64_t H = 40, N = 24;
  const Tensor x = randn({1, H}, 1, 1.0, DType::bf16), residual = randn({1, H}, 2, 1.0, DType::f32),
               norm_w = randn({H}, 3, 1.0, DType::bf16), weight = randn({N, H}, 4, 0.1, DType::bf16);
  RMSNormGemv op(1e-5);
  const auto [out, h] = op.forward(x, residual, norm_w, weight, Tensor());
  ASSERT_EQ(h.dtype(), DType::f32);
  RMSNorm norm(H, 1e-5, {DType::bf16, Device::cpu()});
  norm.weight.copy_(norm_w);
  const auto [y, h2] = norm.forward(x.clone(), residual.clone());
  EXPECT_TRUE(bitwise_equal(h, h2)) << "h: fp32 sum, as RMSNorm's fused add with an fp32 residual";
  EXPECT_TRUE(bitwise_equal(out, Linear().forward(y, weight, Tensor())));
  // The sum was not rounded to bf16: some element of h differs from its bf16 rounding.
  EXPECT_FALSE(bitwise_equal(h.to(DType::bf16).to(DType::f32), h));

  RMSNormGemv gemma(1e-5, 1.0);
  const std::string err = error_of([&] { gemma.forward(x, residual, norm_w, weight, Tensor()); });
  EXPECT_TRUE(contains(err, "fp32 'residual'") && contains(err, "weight_offset")) << err;
}

// forward_normed (Qwen3-MoE's post-attention norm + router) gives forward's out and h and the norm's output, with a
// residual in x's dtype and without one.
TEST(RMSNormGemvNormed, ReturnsTheNormsOutputBesideTheLinears) {
  const int64_t H = 48, N = 16;
  const Tensor x = randn({1, H}, 5, 1.0, DType::bf16), residual = randn({1, H}, 6, 1.0, DType::bf16),
               norm_w = randn({H}, 7, 1.0, DType::bf16), weight = randn({N, H}, 8, 0.1, DType::bf16);
  RMSNormGemv op(1e-6);
  RMSNorm norm(H, 1e-6, {DType::bf16, Device::cpu()});
  norm.weight.copy_(norm_w);
  const auto [out, h, y] = op.forward_normed(x, residual, norm_w, weight, Tensor());
  const auto [out2, h2] = op.forward(x, residual, norm_w, weight, Tensor());
  const auto [y2, h3] = norm.forward(x.clone(), residual.clone());
  EXPECT_TRUE(bitwise_equal(out, out2));
  EXPECT_TRUE(bitwise_equal(h, h2));
  EXPECT_TRUE(bitwise_equal(y, y2)) << "y: fused_add_rms_norm's output";
  EXPECT_TRUE(bitwise_equal(out, Linear().forward(y2, weight, Tensor())));
  const auto [out_first, h_first, y_first] = op.forward_normed(x, Tensor(), norm_w, weight, Tensor());
  EXPECT_FALSE(h_first.defined());
  EXPECT_TRUE(bitwise_equal(y_first, norm.forward(x.clone()))) << "y: rms_norm's output";
}

// tiny-mamba2 at the contract's CPU token counts, Mamba-Codestral (conv_dim 10240, groups of 1024) at 3 tokens, and
// two odd Mamba-2 shapes (tests/mamba_contract.h).
// NOTE: no random shapes here: bench::random_cases rewrites the attention/MLP keys of a config (intermediate_size
// among them), which a Mamba-2 config refuses (intermediate_size must stay num_heads * head_dim).
TEST(MambaOpsContract, TinyMamba2PassesOnCpu) {
  for (const std::string& op : kbn::test::mamba_decode_and_conv_ops())
    kbn::test::check_op_contract({"tiny-mamba2", op}, Device::cpu(), {1, 3, 300}, 0, DType::bf16);
}

TEST(MambaOpsContract, MambaCodestralShapesPassOnCpu) {
  for (const std::string& op : kbn::test::mamba_decode_and_conv_ops())
    kbn::test::check_op_contract({"mamba-codestral-7b-v0.1", op}, Device::cpu(), {3}, 0, DType::bf16);
}

TEST(MambaOpsContract, OddShapesPassOnCpu) {
  for (const char* which : {"odd", "aligned"})
    for (const std::string& op : kbn::test::mamba_decode_and_conv_ops())
      kbn::test::check_op_contract_on_view(op, kbn::test::mamba_view(which), Device::cpu(), {1, 2, 37});
}

}  // namespace
