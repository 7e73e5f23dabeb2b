// The Mamba-2 oracle (tasks/reference/mamba.cpp) against itself in the ways the engine will use it, and against a
// closed form: the chunked SSD scan equals the recurrence at every chunk size; a sequence split across two calls
// (chunked prefill) carries its conv and SSM states exactly; decode's one-token updates equal the prefill scan; the
// gated norm normalises per group.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kbn/error.h"
#include "kbn/rng.h"
#include "reference/reference.h"

namespace {

using namespace kbn;
namespace ref = kbn::reference;

Tensor randn(const Shape& s, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal_(t, seed, 0.0, scale);
  return t;
}

Tensor i32(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {int64_t(v.size())}); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// A small model of the scan's inputs: 3 packed sequences, 4 heads over 2 groups.
struct Scan {
  int64_t nh = 4, P = 3, G = 2, N = 5;
  std::vector<int32_t> q = {0, 5, 42, 43};
  Tensor x, dt, A, B, C, D, dt_bias, init, has_init;
  explicit Scan(uint64_t seed) {
    const int64_t T = q.back();
    x = randn({T, nh, P}, seed);
    dt = randn({T, nh}, seed + 1, 0.5);
    A = Tensor::from_floats({-0.5f, -1.0f, -2.0f, -0.1f}, {nh});
    B = randn({T, G, N}, seed + 2);
    C = randn({T, G, N}, seed + 3);
    D = Tensor::from_floats({0.5f, -1.0f, 0.25f, 0.0f}, {nh});
    dt_bias = randn({nh}, seed + 4, 0.3);
    init = randn({3, nh, P, N}, seed + 5);
    has_init = i32({1, 0, 1});
  }
  int64_t tokens() const { return q.back(); }
};

TEST(ReferenceMamba, ChunkedScanEqualsTheRecurrenceAtEveryChunkSize) {
  const Scan s(11);
  Tensor y = Tensor::empty(s.x.shape(), DType::f32), fin = Tensor::empty({3, s.nh, s.P, s.N}, DType::f32);
  ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, s.init, s.has_init, i32(s.q), 8);
  for (int64_t L : {1, 2, 4, 16, 64}) {
    Tensor y2 = Tensor::empty(s.x.shape(), DType::f32), fin2 = Tensor::empty(fin.shape(), DType::f32);
    ref::ssd_chunked_scan(y2, fin2, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, s.init, s.has_init, i32(s.q), L);
    EXPECT_LT(max_abs_diff(y, y2), 1e-5) << "chunk " << L;
    EXPECT_LT(max_abs_diff(fin, fin2), 1e-5) << "chunk " << L;
  }
}

TEST(ReferenceMamba, ScanMatchesTheClosedForm) {
  // One head, one channel, one state: x = B = C = 1, dt + bias = 0 so dt' = softplus(0) = ln 2, A = -1:
  // S_t = ln2 * sum_{k=0..t} 2^-k = ln2 (2 - 2^-t), y_t = S_t + D with D = 0.5.
  const int64_t T = 6;
  Tensor ones = Tensor::from_floats(std::vector<float>(T, 1.f), {T, 1, 1});
  Tensor dt = Tensor::from_floats(std::vector<float>(T, 0.f), {T, 1});
  Tensor BC = Tensor::from_floats(std::vector<float>(T, 1.f), {T, 1, 1});
  Tensor A = Tensor::from_floats({-1.f}, {1}), D = Tensor::from_floats({0.5f}, {1});
  Tensor y = Tensor::empty({T, 1, 1}, DType::f32), fin = Tensor::empty({1, 1, 1, 1}, DType::f32);
  ref::mamba_chunk_scan_combined(y, fin, ones, dt, A, BC, BC, D, Tensor(), {}, Tensor(), i32({0}), i32({0, int32_t(T)}),
                                 4);
  const auto yv = y.to_doubles();
  for (int64_t t = 0; t < T; ++t)
    EXPECT_NEAR(yv[size_t(t)], std::log(2.0) * (2.0 - std::pow(2.0, -double(t))) + 0.5, 1e-6) << "t " << t;
  EXPECT_NEAR(fin.to_doubles()[0], std::log(2.0) * (2.0 - std::pow(2.0, -double(T - 1))), 1e-6);
  // dt_limit clamps the time step after softplus.
  ref::MambaTimeStep capped;
  capped.max = 0.1;
  ref::mamba_chunk_scan_combined(y, fin, ones, dt, A, BC, BC, D, Tensor(), capped, Tensor(), i32({0}),
                                 i32({0, int32_t(T)}), 4);
  EXPECT_NEAR(y.to_doubles()[0], 0.1 + 0.5, 1e-6);
}

TEST(ReferenceMamba, AScanSplitAcrossTwoCallsCarriesItsState) {
  // Chunked prefill: the first 17 tokens of a sequence, then the rest with the first call's final state.
  const Scan s(21);
  const int64_t T = 37, cut = 17;
  auto rows = [](const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b).contiguous(); };
  Tensor x = rows(s.x, 5, 42), dt = rows(s.dt, 5, 42), B = rows(s.B, 5, 42), C = rows(s.C, 5, 42);
  Tensor y = Tensor::empty(x.shape(), DType::f32), fin = Tensor::empty({1, s.nh, s.P, s.N}, DType::f32);
  ref::mamba_chunk_scan_combined(y, fin, x, dt, s.A, B, C, s.D, s.dt_bias, {}, Tensor(), i32({0}), i32({0, int32_t(T)}),
                                 16);
  Tensor y1 = Tensor::empty({cut, s.nh, s.P}, DType::f32), mid = Tensor::empty(fin.shape(), DType::f32);
  ref::mamba_chunk_scan_combined(y1, mid, rows(x, 0, cut), rows(dt, 0, cut), s.A, rows(B, 0, cut), rows(C, 0, cut), s.D,
                                 s.dt_bias, {}, Tensor(), i32({0}), i32({0, int32_t(cut)}), 16);
  Tensor y2 = Tensor::empty({T - cut, s.nh, s.P}, DType::f32), fin2 = Tensor::empty(fin.shape(), DType::f32);
  ref::ssd_chunked_scan(y2, fin2, rows(x, cut, T), rows(dt, cut, T), s.A, rows(B, cut, T), rows(C, cut, T), s.D,
                        s.dt_bias, {}, mid, i32({1}), i32({0, int32_t(T - cut)}), 16);
  EXPECT_LT(max_abs_diff(rows(y, 0, cut), y1), 1e-6);
  EXPECT_LT(max_abs_diff(rows(y, cut, T), y2), 1e-5);
  EXPECT_LT(max_abs_diff(fin, fin2), 1e-5);
}

TEST(ReferenceMamba, DecodeUpdatesEqualThePrefillScan) {
  const Scan s(31);
  // Sequence 1 (37 tokens, no initial state) token by token through selective_state_update, in slot 2 of 3.
  Tensor y = Tensor::empty(s.x.shape(), DType::f32), fin = Tensor::empty({3, s.nh, s.P, s.N}, DType::f32);
  ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, s.init, s.has_init, i32(s.q),
                                 16);
  Tensor state = Tensor::zeros({3, s.nh, s.P, s.N}, DType::f32);
  double worst = 0;
  for (int64_t t = 5; t < 42; ++t) {
    Tensor out = Tensor::empty({1, s.nh, s.P}, DType::f32);
    ref::selective_state_update(out, state, s.x.slice(0, t, t + 1).contiguous(), s.dt.slice(0, t, t + 1).contiguous(),
                                s.A, s.B.slice(0, t, t + 1).contiguous(), s.C.slice(0, t, t + 1).contiguous(), s.D,
                                s.dt_bias, {}, i32({2}));
    worst = std::max(worst, max_abs_diff(out, y.slice(0, t, t + 1).contiguous()));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(max_abs_diff(state.slice(0, 2, 3).contiguous(), fin.slice(0, 1, 2).contiguous()), 1e-5);
  // The other slots are untouched.
  EXPECT_EQ(max_abs_diff(state.slice(0, 0, 2).contiguous(), Tensor::zeros({2, s.nh, s.P, s.N}, DType::f32)), 0.0);
}

TEST(ReferenceMamba, ConvolutionPrefillSplitAndDecodeAgree) {
  const int64_t dim = 6, W = 4, T = 9;
  const Tensor x = randn({T, dim}, 41), w = randn({dim, W}, 42), bias = randn({dim}, 43);
  const Tensor start = randn({2, W - 1, dim}, 44);  // slot 1 holds the sequence's earlier inputs
  // Whole sequence, with the initial state of slot 1.
  Tensor states = start.clone(), out = Tensor::empty({T, dim}, DType::f32);
  ref::causal_conv1d_fn(out, x, w, bias, states, i32({1}), i32({1}), i32({0, int32_t(T)}), true);
  // The same in two calls (2 tokens, then 7): the state carries the inputs across the cut.
  Tensor states2 = start.clone(), a = Tensor::empty({2, dim}, DType::f32), b = Tensor::empty({T - 2, dim}, DType::f32);
  ref::causal_conv1d_fn(a, x.slice(0, 0, 2).contiguous(), w, bias, states2, i32({1}), i32({1}), i32({0, 2}), true);
  ref::causal_conv1d_fn(b, x.slice(0, 2, T).contiguous(), w, bias, states2, i32({1}), i32({1}), i32({0, int32_t(T - 2)}),
                        true);
  EXPECT_LT(max_abs_diff(out.slice(0, 0, 2).contiguous(), a), 1e-6);
  EXPECT_LT(max_abs_diff(out.slice(0, 2, T).contiguous(), b), 1e-6);
  EXPECT_LT(max_abs_diff(states, states2), 1e-7);
  // Token by token through the decode update.
  Tensor states3 = start.clone();
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    Tensor o = Tensor::empty({1, dim}, DType::f32);
    ref::causal_conv1d_update(o, x.slice(0, t, t + 1).contiguous(), states3, w, bias, i32({1}), true);
    worst = std::max(worst, max_abs_diff(o, out.slice(0, t, t + 1).contiguous()));
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_LT(max_abs_diff(states, states3), 1e-7);
  // By hand, channel 0, token 0 without initial state: silu(bias + w[0, W-1] x[0, 0]).
  Tensor zero_states = Tensor::zeros({1, W - 1, dim}, DType::f32), o1 = Tensor::empty({1, dim}, DType::f32);
  ref::causal_conv1d_fn(o1, x.slice(0, 0, 1).contiguous(), w, bias, zero_states, i32({0}), i32({0}), i32({0, 1}), true);
  const double v = bias.to_doubles()[0] + w.to_doubles()[size_t(W - 1)] * x.to_doubles()[0];
  EXPECT_NEAR(o1.to_doubles()[0], v / (1 + std::exp(-v)), 1e-6);
  // A sequence shorter than the window keeps the older inputs in its new state: [start[1][1:], x0].
  EXPECT_NEAR(zero_states.to_doubles()[size_t((W - 2) * dim)], x.to_doubles()[0], 1e-7);
}

TEST(ReferenceMamba, GatedNormNormalisesEachGroup) {
  const int64_t T = 3, H = 8, group = 4;
  const Tensor x = randn({T, H}, 51), gate = randn({T, H}, 52);
  const Tensor ones = Tensor::from_floats(std::vector<float>(H, 1.f), {H});
  Tensor out = Tensor::empty({T, H}, DType::f32);
  ref::rms_norm_gated(out, x, gate, ones, group, 1e-12);
  const auto o = out.to_doubles(), xv = x.to_doubles(), gv = gate.to_doubles();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g0 = 0; g0 < H; g0 += group) {
      double ss = 0;
      for (int64_t i = g0; i < g0 + group; ++i) {
        ss += o[size_t(t * H + i)] * o[size_t(t * H + i)];
        // The sign follows x * silu(gate).
        const double y = xv[size_t(t * H + i)] * gv[size_t(t * H + i)] / (1 + std::exp(-gv[size_t(t * H + i)]));
        EXPECT_EQ(o[size_t(t * H + i)] > 0, y > 0);
      }
      EXPECT_NEAR(ss / double(group), 1.0, 1e-5) << "token " << t << " group " << g0 / group;
    }
  // One group over the whole row is not the same as two.
  Tensor whole = Tensor::empty({T, H}, DType::f32);
  ref::rms_norm_gated(whole, x, gate, ones, H, 1e-12);
  EXPECT_GT(max_abs_diff(whole, out), 1e-3);
}

TEST(ReferenceMamba, BadArgumentsAreNamed) {
  const Scan s(61);
  Tensor y = Tensor::empty(s.x.shape(), DType::f32), fin = Tensor::empty({3, s.nh, s.P, s.N}, DType::f32);
  auto error = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error([&] {
              ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, s.init, s.has_init,
                                             i32(s.q), 24);
            }).find("chunk_size must be a power of two, got 24"),
            std::string::npos);
  EXPECT_NE(error([&] {
              ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, s.init, s.has_init,
                                             i32({0, 5, 40}), 8);
            }).find("'query_start_loc' must run from 0 to num_tokens (43)"),
            std::string::npos);
  const Tensor B3 = randn({s.tokens(), 3, s.N}, 62);
  EXPECT_NE(error([&] {
              ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, B3, B3, s.D, s.dt_bias, {}, s.init, s.has_init,
                                             i32(s.q), 8);
            }).find("num_heads (4) must be a multiple of n_groups (3)"),
            std::string::npos);
  EXPECT_NE(error([&] {
              ref::mamba_chunk_scan_combined(y, fin, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, {}, Tensor(),
                                             s.has_init, i32(s.q), 8);
            }).find("initial_states"),
            std::string::npos);
  Tensor states = Tensor::zeros({2, 3, 6}, DType::f32), o = Tensor::empty({1, 6}, DType::f32);
  EXPECT_NE(error([&] {
              ref::causal_conv1d_update(o, randn({1, 6}, 63), states, randn({6, 4}, 64), Tensor(), i32({2}), true);
            }).find("'conv_state_indices'[0] = 2 is not a slot in [0, 2)"),
            std::string::npos);
}

}  // namespace
