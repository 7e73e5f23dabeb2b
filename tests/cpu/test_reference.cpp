// Tests of the oracle (tasks/reference): each op against a direct formula, a hand-computed case, or an
// invariant that any correct implementation satisfies, plus refusals that name the bad argument.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kbn/rng.h"
#include "kbn/tensor.h"
#include "reference/reference.h"

using namespace kbn;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr DType kFloatDTypes[] = {DType::f32, DType::bf16, DType::f16};

DType float_dtype(int index) { return kFloatDTypes[index]; }

Tensor randn(const Shape& shape, DType dtype, uint64_t seed, const char* label, double std = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_normal_(t, hash_seed(seed, label), 0.0, std);
  return t;
}

// The values of `t` in a view whose outer rows lie `pad` elements further apart than contiguous ones (as q and k
// sliced out of a fused qkv tensor); the gaps hold NaN, so reading them shows up in the result.
Tensor with_row_gap(const Tensor& t, int64_t pad) {
  const int64_t rows = t.size(0), inner = t.numel() / std::max<int64_t>(rows, 1);
  Tensor buffer = Tensor::full({rows, inner + pad}, kNaN, t.dtype());
  Shape strides = contiguous_strides(t.shape());
  strides[0] = inner + pad;
  Tensor view = buffer.as_strided(t.shape(), strides, 0);
  view.copy_(t);
  return view;
}

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Relative precision of one rounding to `dtype` (one ulp relative to the value: twice the worst case).
double rounding_rtol(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 1.0 / 128;
    case DType::f16:
      return 1.0 / 1024;
    default:
      return 1.0 / 8388608;
  }
}

// "" when every |actual - expected| <= atol + rtol * |expected| (NaN matches only NaN); else the first mismatch.
std::string mismatch(const std::vector<double>& actual, const std::vector<double>& expected, double rtol, double atol) {
  if (actual.size() != expected.size()) {
    return "sizes differ: " + std::to_string(actual.size()) + " vs " + std::to_string(expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok = std::isnan(e) ? std::isnan(a) : std::abs(a - e) <= atol + rtol * std::abs(e);
    if (!ok) {
      std::ostringstream os;
      os.precision(17);
      os << "element " << i << ": got " << a << ", expected " << e;
      return os.str();
    }
  }
  return "";
}

// The message of the kbn::Error that f throws, or "<no error>".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& text, std::string_view fragment) { return text.find(fragment) != std::string::npos; }

double silu(double a) { return a / (1.0 + std::exp(-a)); }

}  // namespace

// ---- rms_norm, fused_add_rms_norm ----

RC_GTEST_PROP(ReferenceRmsNorm, UnitWeightGivesUnitRms, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t hidden = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 64), rc::gen::element<int64_t>(769, 5125));
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor x = randn({tokens, hidden}, dtype, seed, "x", 3.0);
  Tensor out = Tensor::empty({tokens, hidden}, DType::f32);
  reference::rms_norm(out, x, Tensor::full({hidden}, 1.0, dtype), 1e-30);
  const std::vector<double> o = out.to_doubles();
  for (int64_t t = 0; t < tokens; ++t) {
    double sum_sq = 0;
    for (int64_t i = 0; i < hidden; ++i) sum_sq += o[size_t(t * hidden + i)] * o[size_t(t * hidden + i)];
    RC_LOG() << "token " << t << " rms " << std::sqrt(sum_sq / double(hidden)) << "\n";
    RC_ASSERT(std::abs(std::sqrt(sum_sq / double(hidden)) - 1.0) < 1e-6);
  }
}

RC_GTEST_PROP(ReferenceRmsNorm, ScalesWithWeightElementwise, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 4), hidden = *rc::gen::inRange<int64_t>(1, 100);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor x = randn({tokens, hidden}, DType::f32, seed, "x");
  Tensor weight = randn({hidden}, DType::f32, seed, "w");
  Tensor unit = Tensor::empty({tokens, hidden}, DType::f32), scaled = Tensor::empty({tokens, hidden}, DType::f32);
  reference::rms_norm(unit, x, Tensor::full({hidden}, 1.0, DType::f32), 1e-6);
  reference::rms_norm(scaled, x, weight, 1e-6);
  std::vector<double> expected = unit.to_doubles();
  const std::vector<double> w = weight.to_doubles();
  for (size_t i = 0; i < expected.size(); ++i) expected[i] *= w[i % size_t(hidden)];
  RC_ASSERT(mismatch(scaled.to_doubles(), expected, 3e-7, 1e-30) == std::string());
}

TEST(ReferenceRmsNorm, FusedAddEqualsAddThenNorm) {
  const int64_t tokens = 3, hidden = 769;
  Tensor x = randn({tokens, hidden}, DType::f32, 1, "x"), residual = randn({tokens, hidden}, DType::f32, 1, "r");
  Tensor weight = randn({hidden}, DType::f32, 1, "w");
  const std::vector<double> xv = x.to_doubles(), rv = residual.to_doubles();
  std::vector<float> sum(xv.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = float(xv[i] + rv[i]);
  Tensor expected_x = Tensor::empty({tokens, hidden}, DType::f32);
  reference::rms_norm(expected_x, Tensor::from_floats(sum, {tokens, hidden}), weight, 1e-5);

  reference::fused_add_rms_norm(x, residual, weight, 1e-5);
  EXPECT_EQ(residual.to_floats(), sum);
  EXPECT_EQ(x.to_floats(), expected_x.to_floats());
}

TEST(ReferenceRmsNorm, RejectsMismatchedWeight) {
  Tensor x = Tensor::zeros({2, 8}, DType::f32), out = Tensor::empty({2, 8}, DType::f32);
  const std::string msg = error_of([&] { reference::rms_norm(out, x, Tensor::zeros({7}, DType::f32), 1e-6); });
  EXPECT_TRUE(contains(msg, "'x'") && contains(msg, "hidden_size")) << msg;
}

// ---- silu_and_mul ----

RC_GTEST_PROP(ReferenceSiluAndMul, MatchesFormula, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 6);
  const int64_t d = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 40), rc::gen::just<int64_t>(769));
  const DType in_dtype = float_dtype(*rc::gen::inRange(0, 3)), out_dtype = float_dtype(*rc::gen::inRange(0, 3));
  const int64_t pad = *rc::gen::inRange<int64_t>(0, 3);
  Tensor x = with_row_gap(randn({tokens, 2 * d}, in_dtype, *rc::gen::arbitrary<uint64_t>(), "x", 4.0), pad);
  Tensor out = Tensor::empty({tokens, d}, out_dtype);
  reference::silu_and_mul(out, x);
  const std::vector<double> xv = x.to_doubles();
  std::vector<double> expected(size_t(tokens * d));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      expected[size_t(t * d + i)] = silu(xv[size_t(t * 2 * d + i)]) * xv[size_t(t * 2 * d + d + i)];
    }
  }
  RC_ASSERT(mismatch(out.to_doubles(), expected, rounding_rtol(out_dtype), 1e-7) == std::string());
}

TEST(ReferenceSiluAndMul, KnownValues) {
  // gates | ups: silu(0) = 0, silu(1) = 1 / (1 + e^-1), silu(-40) ~ -40 e^-40, silu(30) ~ 30.
  Tensor x = Tensor::from_floats({0, 1, -40, 30, 3, 2, 5, 1}, {1, 8});
  Tensor out = Tensor::empty({1, 4}, DType::f32);
  reference::silu_and_mul(out, x);
  const std::vector<float> o = out.to_floats();
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_FLOAT_EQ(o[1], float(2.0 / (1.0 + std::exp(-1.0))));
  EXPECT_FLOAT_EQ(o[2], float(5.0 * -40.0 / (1.0 + std::exp(40.0))));
  EXPECT_FLOAT_EQ(o[3], 30.0f);
}

TEST(ReferenceSiluAndMul, RejectsBadShapes) {
  Tensor out = Tensor::empty({2, 3}, DType::f32);
  std::string msg = error_of([&] { reference::silu_and_mul(out, Tensor::zeros({2, 5}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "reference::silu_and_mul") && contains(msg, "'x'") && contains(msg, "even")) << msg;
  msg = error_of([&] { reference::silu_and_mul(out, Tensor::zeros({2, 8}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "'out'")) << msg;
}

// ---- rope_cos_sin_cache ----

TEST(ReferenceRope, CacheMatchesDefinitionByHand) {
  // rotary_dim 4, base 100: inv_freq = [100^0, 100^(-1/2)] = [1, 0.1].
  Tensor cache = reference::rope_cos_sin_cache(4, 5, 100.0, RopeScaling{});
  ASSERT_EQ(cache.shape(), (Shape{5, 4}));
  ASSERT_EQ(cache.dtype(), DType::f32);
  const std::vector<float> c = cache.to_floats();
  EXPECT_EQ(std::vector<float>(c.begin(), c.begin() + 4), (std::vector<float>{1, 1, 0, 0}));
  const std::vector<float> row3(c.begin() + 12, c.begin() + 16);
  EXPECT_EQ(row3, (std::vector<float>{float(std::cos(3.0)), float(std::cos(0.3)), float(std::sin(3.0)),
                                      float(std::sin(0.3))}));
}

TEST(ReferenceRope, Llama3KeepsHighAndDividesLowFrequencies) {
  // Llama-3.1-8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original context 8192.
  const int64_t rotary_dim = 128, half = 64, max_position = 64;
  const double base = 500000.0;
  RopeScaling llama3{"llama3", 8.0, 1.0, 4.0, 8192};
  const std::vector<float> plain = reference::rope_cos_sin_cache(rotary_dim, max_position, base, {}).to_floats();
  const std::vector<float> scaled = reference::rope_cos_sin_cache(rotary_dim, max_position, base, llama3).to_floats();
  auto at = [&](const std::vector<float>& table, int64_t p, int64_t col) {
    return table[size_t(p * rotary_dim + col)];
  };
  int high = 0, low = 0, medium = 0;
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(base, -double(2 * i) / double(rotary_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    SCOPED_TRACE("frequency " + std::to_string(i) + ", wavelength " + std::to_string(wavelen));
    if (wavelen < 8192.0 / 4) {
      ++high;
      for (int64_t p = 0; p < max_position; ++p) {
        EXPECT_EQ(at(scaled, p, i), at(plain, p, i));
        EXPECT_EQ(at(scaled, p, half + i), at(plain, p, half + i));
      }
    } else if (wavelen > 8192.0 / 1) {
      ++low;
      // Frequency divided by 8: position 8p of the scaled table is position p of the plain one.
      for (int64_t p = 0; p * 8 < max_position; ++p) {
        EXPECT_NEAR(at(scaled, 8 * p, i), at(plain, p, i), 1e-6);
        EXPECT_NEAR(at(scaled, 8 * p, half + i), at(plain, p, half + i), 1e-6);
      }
    } else {
      ++medium;
      const double angle = std::atan2(at(scaled, 1, half + i), at(scaled, 1, i));
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_GT(angle, freq / 8);
      EXPECT_LT(angle, freq);
      EXPECT_NEAR(angle, (1 - smooth) * freq / 8 + smooth * freq, 1e-5 * freq);
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(ReferenceRope, RejectsBadArguments) {
  std::string msg = error_of([] { reference::rope_cos_sin_cache(8, 4, 10000.0, RopeScaling{"longrope"}); });
  EXPECT_TRUE(contains(msg, "rope_type") && contains(msg, "longrope")) << msg;
  msg = error_of([] { reference::rope_cos_sin_cache(7, 4, 10000.0, {}); });
  EXPECT_TRUE(contains(msg, "'rotary_dim'")) << msg;
  msg = error_of([] { reference::rope_cos_sin_cache(8, 4, 10000.0, RopeScaling{"llama3", 8.0, 4.0, 1.0, 8192}); });
  EXPECT_TRUE(contains(msg, "high_freq_factor")) << msg;
}

// ---- rotary_embedding ----

namespace {

struct RotaryCase {
  int64_t tokens, num_heads, num_kv_heads, head_size, rotary_dim, max_position;
  bool is_neox;
};

RotaryCase gen_rotary_case() {
  RotaryCase c;
  c.tokens = *rc::gen::inRange<int64_t>(1, 6);
  c.num_heads = *rc::gen::inRange<int64_t>(1, 5);
  c.num_kv_heads = *rc::gen::inRange<int64_t>(1, 3);
  c.rotary_dim = 2 * *rc::gen::inRange<int64_t>(1, 9);
  c.head_size = c.rotary_dim + *rc::gen::inRange<int64_t>(0, 4);
  c.max_position = *rc::gen::inRange<int64_t>(1, 300);
  c.is_neox = *rc::gen::arbitrary<bool>();
  RC_LOG() << "tokens " << c.tokens << " heads " << c.num_heads << "/" << c.num_kv_heads << " head_size " << c.head_size
           << " rotary_dim " << c.rotary_dim << " max_position " << c.max_position << " neox " << c.is_neox << "\n";
  return c;
}

Tensor random_positions(int64_t tokens, int64_t max_position, uint64_t seed) {
  Tensor positions = Tensor::empty({tokens}, DType::i64);
  fill_randint_(positions, hash_seed(seed, "positions"), 0, max_position);
  return positions;
}

// Each rotated pair of every head: (first index, second index) of the pair, for NeoX or GPT-J style.
std::vector<std::pair<int64_t, int64_t>> rotary_pairs(int64_t rotary_dim, bool is_neox) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    pairs.push_back(is_neox ? std::pair{i, i + rotary_dim / 2} : std::pair{2 * i, 2 * i + 1});
  }
  return pairs;
}

}  // namespace

RC_GTEST_PROP(ReferenceRotary, IdentityAtPositionZero, ()) {
  const RotaryCase c = gen_rotary_case();
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor query = randn({c.tokens, c.num_heads * c.head_size}, dtype, seed, "q");
  Tensor key = randn({c.tokens, c.num_kv_heads * c.head_size}, dtype, seed, "k");
  const std::vector<uint8_t> query_before = raw_bytes(query), key_before = raw_bytes(key);
  Tensor cache = reference::rope_cos_sin_cache(c.rotary_dim, c.max_position, 10000.0, {});
  reference::rotary_embedding(Tensor::zeros({c.tokens}, DType::i64), query, key, c.head_size, cache, c.is_neox);
  RC_ASSERT(raw_bytes(query) == query_before);
  RC_ASSERT(raw_bytes(key) == key_before);
}

RC_GTEST_PROP(ReferenceRotary, PreservesPairNormsAndLeavesTailUnchanged, ()) {
  const RotaryCase c = gen_rotary_case();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor query = randn({c.tokens, c.num_heads * c.head_size}, DType::f32, seed, "q");
  Tensor key = randn({c.tokens, c.num_kv_heads * c.head_size}, DType::f32, seed, "k");
  const std::vector<double> q0 = query.to_doubles(), k0 = key.to_doubles();
  Tensor cache = reference::rope_cos_sin_cache(c.rotary_dim, c.max_position, 10000.0, {});
  reference::rotary_embedding(random_positions(c.tokens, c.max_position, seed), query, key, c.head_size, cache,
                              c.is_neox);
  const auto pairs = rotary_pairs(c.rotary_dim, c.is_neox);
  auto check = [&](const std::vector<double>& before, const std::vector<double>& after, int64_t heads) {
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const size_t head = size_t((t * heads + h) * c.head_size);
        for (auto [a, b] : pairs) {
          const double n0 = std::hypot(before[head + size_t(a)], before[head + size_t(b)]);
          const double n1 = std::hypot(after[head + size_t(a)], after[head + size_t(b)]);
          RC_ASSERT(std::abs(n1 - n0) <= 1e-6 * n0 + 1e-30);
        }
        for (int64_t i = c.rotary_dim; i < c.head_size; ++i)
          RC_ASSERT(after[head + size_t(i)] == before[head + size_t(i)]);
      }
    }
  };
  check(q0, query.to_doubles(), c.num_heads);
  check(k0, key.to_doubles(), c.num_kv_heads);
}

RC_GTEST_PROP(ReferenceRotary, InverseRotationRestoresInput, ()) {
  const RotaryCase c = gen_rotary_case();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor query = randn({c.tokens, c.num_heads * c.head_size}, DType::f32, seed, "q");
  Tensor key = randn({c.tokens, c.num_kv_heads * c.head_size}, DType::f32, seed, "k");
  const std::vector<double> q0 = query.to_doubles(), k0 = key.to_doubles();
  Tensor cache = reference::rope_cos_sin_cache(c.rotary_dim, c.max_position, 10000.0, {});
  // Rotating by -angle: the same cos, negated sin.
  Tensor inverse = cache.clone();
  Tensor sin_half = inverse.slice(1, c.rotary_dim / 2, c.rotary_dim);
  std::vector<float> negated = sin_half.to_floats();
  for (float& v : negated) v = -v;
  sin_half.copy_(Tensor::from_floats(negated, sin_half.shape()));
  Tensor positions = random_positions(c.tokens, c.max_position, seed);
  reference::rotary_embedding(positions, query, key, c.head_size, cache, c.is_neox);
  reference::rotary_embedding(positions, query, key, c.head_size, inverse, c.is_neox);
  RC_ASSERT(mismatch(query.to_doubles(), q0, 1e-6, 1e-6) == std::string());
  RC_ASSERT(mismatch(key.to_doubles(), k0, 1e-6, 1e-6) == std::string());
}

TEST(ReferenceRotary, HandComputedNeoxAndGptj) {
  // One head of size 6, rotary_dim 4, base 100 (inv_freq [1, 0.1]), position 1; features 4 and 5 do not rotate.
  Tensor cache = reference::rope_cos_sin_cache(4, 2, 100.0, {});
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.1), s1 = std::sin(0.1);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  Tensor positions = Tensor::from_i64({1}, {1});

  Tensor q = Tensor::from_floats(x, {1, 6}), k = Tensor::from_floats(x, {1, 6});
  reference::rotary_embedding(positions, q, k, 6, cache, true);
  const std::vector<double> neox = {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1, 5, 6};
  EXPECT_EQ(mismatch(q.to_doubles(), neox, 1e-6, 1e-6), "");
  EXPECT_EQ(mismatch(k.to_doubles(), neox, 1e-6, 1e-6), "");

  q = Tensor::from_floats(x, {1, 6});
  k = Tensor::from_floats(x, {1, 6});
  reference::rotary_embedding(positions, q, k, 6, cache, false);
  const std::vector<double> gptj = {1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1, 5, 6};
  EXPECT_EQ(mismatch(q.to_doubles(), gptj, 1e-6, 1e-6), "");
}

RC_GTEST_PROP(ReferenceRotary, GptjIsNeoxOnInterleavedFeatures, ()) {
  // Placing NeoX feature i at 2i and feature i + half at 2i + 1 turns NeoX pairs into GPT-J pairs.
  const RotaryCase c = gen_rotary_case();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const int64_t half = c.rotary_dim / 2, width = c.num_heads * c.head_size;
  Tensor query = randn({c.tokens, width}, DType::f32, seed, "q");
  std::vector<int64_t> to_interleaved(size_t(c.head_size));
  for (int64_t i = 0; i < c.head_size; ++i) to_interleaved[size_t(i)] = i;
  for (int64_t i = 0; i < half; ++i) {
    to_interleaved[size_t(i)] = 2 * i;
    to_interleaved[size_t(i + half)] = 2 * i + 1;
  }
  auto interleave = [&](const std::vector<float>& v) {
    std::vector<float> out(v.size());
    for (size_t head = 0; head < v.size(); head += size_t(c.head_size)) {
      for (int64_t i = 0; i < c.head_size; ++i) out[head + size_t(to_interleaved[size_t(i)])] = v[head + size_t(i)];
    }
    return out;
  };
  Tensor neox_q = query.clone(), neox_k = query.clone();
  Tensor gptj_q = Tensor::from_floats(interleave(query.to_floats()), {c.tokens, width}), gptj_k = gptj_q.clone();
  Tensor cache = reference::rope_cos_sin_cache(c.rotary_dim, c.max_position, 10000.0, {});
  Tensor positions = random_positions(c.tokens, c.max_position, seed);
  reference::rotary_embedding(positions, neox_q, neox_k, c.head_size, cache, true);
  reference::rotary_embedding(positions, gptj_q, gptj_k, c.head_size, cache, false);
  RC_ASSERT(interleave(neox_q.to_floats()) == gptj_q.to_floats());
}

RC_GTEST_PROP(ReferenceRotary, StridedSlicesOfFusedQkvMatchContiguous, ()) {
  const RotaryCase c = gen_rotary_case();
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const int64_t q_width = c.num_heads * c.head_size, kv_width = c.num_kv_heads * c.head_size;
  Tensor qkv = randn({c.tokens, q_width + 2 * kv_width}, dtype, seed, "qkv");
  Tensor query = qkv.slice(1, 0, q_width), key = qkv.slice(1, q_width, q_width + kv_width);
  Tensor value = qkv.slice(1, q_width + kv_width, q_width + 2 * kv_width);
  Tensor dense_query = query.clone(), dense_key = key.clone();
  const std::vector<uint8_t> value_before = raw_bytes(value);
  Tensor cache = reference::rope_cos_sin_cache(c.rotary_dim, c.max_position, 10000.0, {});
  Tensor positions = random_positions(c.tokens, c.max_position, seed);
  reference::rotary_embedding(positions, query, key, c.head_size, cache, c.is_neox);
  reference::rotary_embedding(positions, dense_query, dense_key, c.head_size, cache, c.is_neox);
  RC_ASSERT(raw_bytes(query) == raw_bytes(dense_query));
  RC_ASSERT(raw_bytes(key) == raw_bytes(dense_key));
  RC_ASSERT(raw_bytes(value) == value_before);
}

TEST(ReferenceRotary, AcceptsI32PositionsAnd3DOperands) {
  const int64_t tokens = 5, heads = 3, head_size = 10;
  Tensor cache = reference::rope_cos_sin_cache(8, 50, 10000.0, {});
  Tensor q64 = randn({tokens, heads * head_size}, DType::bf16, 3, "q"),
         k64 = randn({tokens, head_size}, DType::bf16, 3, "k");
  Tensor q32 = q64.clone().view({tokens, heads, head_size}), k32 = k64.clone();
  reference::rotary_embedding(Tensor::from_i64({0, 7, 49, 3, 7}, {tokens}), q64, k64, head_size, cache, true);
  reference::rotary_embedding(Tensor::from_i32({0, 7, 49, 3, 7}, {tokens}), q32, k32, head_size, cache, true);
  EXPECT_EQ(raw_bytes(q64), raw_bytes(q32));
  EXPECT_EQ(raw_bytes(k64), raw_bytes(k32));
}

TEST(ReferenceRotary, RejectsBadArguments) {
  Tensor cache = reference::rope_cos_sin_cache(8, 10, 10000.0, {});
  Tensor q = Tensor::zeros({3, 16}, DType::f32), k = Tensor::zeros({3, 8}, DType::f32);
  std::string msg = error_of([&] {
    reference::rotary_embedding(Tensor::from_i64({0, 1, 10}, {3}), q, k, 8, cache, true);
  });
  EXPECT_TRUE(contains(msg, "'positions'") && contains(msg, "token 2") && contains(msg, "10")) << msg;
  msg = error_of([&] { reference::rotary_embedding(Tensor::from_i64({0, -1, 1}, {3}), q, k, 8, cache, true); });
  EXPECT_TRUE(contains(msg, "token 1")) << msg;
  Tensor bad_key = Tensor::zeros({3, 12}, DType::f32);
  msg = error_of([&] { reference::rotary_embedding(Tensor::from_i64({0, 1, 2}, {3}), q, bad_key, 8, cache, true); });
  EXPECT_TRUE(contains(msg, "reference::rotary_embedding") && contains(msg, "'key'")) << msg;
  msg = error_of([&] { reference::rotary_embedding(Tensor::from_i64({0, 1, 2}, {3}), q, k, 4, cache, true); });
  EXPECT_TRUE(contains(msg, "'cos_sin_cache'")) << msg;
  msg = error_of([&] { reference::rotary_embedding(Tensor::from_floats({0, 1, 2}, {3}), q, k, 8, cache, true); });
  EXPECT_TRUE(contains(msg, "'positions'") && contains(msg, "i64")) << msg;
}

// ---- embedding ----

RC_GTEST_PROP(ReferenceEmbedding, GathersRowsBitwise, ()) {
  const int64_t vocab = *rc::gen::inRange<int64_t>(1, 50), hidden = *rc::gen::inRange<int64_t>(1, 40);
  const int64_t tokens = *rc::gen::inRange<int64_t>(0, 10);
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const bool i32_ids = *rc::gen::arbitrary<bool>();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor weight = randn({vocab, hidden}, dtype, seed, "w");
  Tensor ids = Tensor::empty({tokens}, i32_ids ? DType::i32 : DType::i64);
  if (tokens > 0) fill_randint_(ids, hash_seed(seed, "ids"), 0, vocab);
  Tensor out = Tensor::full({tokens, hidden}, kNaN, dtype);
  reference::embedding(out, ids, weight);
  const std::vector<int64_t> id = ids.to_ints();
  for (int64_t t = 0; t < tokens; ++t) {
    RC_ASSERT(raw_bytes(out.select(0, t)) == raw_bytes(weight.select(0, id[size_t(t)])));
  }
}

TEST(ReferenceEmbedding, RejectsIdOutsideVocab) {
  Tensor weight = Tensor::zeros({10, 4}, DType::bf16), out = Tensor::empty({3, 4}, DType::bf16);
  std::string msg = error_of([&] { reference::embedding(out, Tensor::from_i32({1, 10, 2}, {3}), weight); });
  EXPECT_TRUE(contains(msg, "reference::embedding") && contains(msg, "'ids'") && contains(msg, "token 1")) << msg;
  msg = error_of([&] { reference::embedding(out, Tensor::from_i64({1, 2, -3}, {3}), weight); });
  EXPECT_TRUE(contains(msg, "token 2")) << msg;
  Tensor wide_out = Tensor::empty({3, 5}, DType::bf16);
  msg = error_of([&] { reference::embedding(wide_out, Tensor::from_i64({1, 2, 3}, {3}), weight); });
  EXPECT_TRUE(contains(msg, "'out'")) << msg;
}

// ---- linear ----

TEST(ReferenceLinear, HandComputedCase) {
  Tensor x = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor weight = Tensor::from_floats({1, 0, -1, 0.5, 0.5, 0.5}, {2, 3});
  Tensor out = Tensor::empty({2, 2}, DType::f32);
  reference::linear(out, x, weight, Tensor());
  EXPECT_EQ(out.to_floats(), (std::vector<float>{-2, 3, -2, 7.5}));
  reference::linear(out, x, weight, Tensor::from_floats({10, -1}, {2}));
  EXPECT_EQ(out.to_floats(), (std::vector<float>{8, 2, 8, 6.5}));
}

RC_GTEST_PROP(ReferenceLinear, MatchesRowDotProducts, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 5), out_features = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t in_features = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 50), rc::gen::just<int64_t>(769));
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3)), out_dtype = float_dtype(*rc::gen::inRange(0, 3));
  const bool with_bias = *rc::gen::arbitrary<bool>();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Tensor x = with_row_gap(randn({tokens, in_features}, dtype, seed, "x"), *rc::gen::inRange<int64_t>(0, 5));
  Tensor weight = randn({out_features, in_features}, dtype, seed, "w", 0.1);
  Tensor bias = with_bias ? randn({out_features}, dtype, seed, "b") : Tensor();
  Tensor out = Tensor::empty({tokens, out_features}, out_dtype);
  reference::linear(out, x, weight, bias);
  const std::vector<double> xv = x.to_doubles(), w = weight.to_doubles();
  std::vector<double> expected(size_t(tokens * out_features), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < out_features; ++j) {
      double dot = with_bias ? bias.to_doubles()[size_t(j)] : 0.0;
      for (int64_t i = 0; i < in_features; ++i) dot += xv[size_t(t * in_features + i)] * w[size_t(j * in_features + i)];
      expected[size_t(t * out_features + j)] = dot;
    }
  }
  RC_ASSERT(mismatch(out.to_doubles(), expected, rounding_rtol(out_dtype), 1e-12) == std::string());
}

RC_GTEST_PROP(ReferenceLinear, IsLinearInX, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 4), out_features = *rc::gen::inRange<int64_t>(1, 7);
  const int64_t in_features = *rc::gen::element<int64_t>(1, 7, 64, 769);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  // Small-integer inputs keep a * x1 + b * x2 exact in f32, so linearity holds to the output rounding.
  auto small_ints = [&](const Shape& shape, const char* label) {
    Tensor t = Tensor::empty(shape, DType::i32);
    fill_randint_(t, hash_seed(seed, label), -8, 9);
    return t.to(DType::f32);
  };
  Tensor x1 = small_ints({tokens, in_features}, "x1"), x2 = small_ints({tokens, in_features}, "x2");
  Tensor weight = small_ints({out_features, in_features}, "w");
  const double a = double(*rc::gen::inRange(-5, 6)), b = double(*rc::gen::inRange(-5, 6));
  std::vector<float> combined(size_t(tokens * in_features));
  const std::vector<float> v1 = x1.to_floats(), v2 = x2.to_floats();
  for (size_t i = 0; i < combined.size(); ++i) combined[i] = float(a * v1[i] + b * v2[i]);
  Tensor y1 = Tensor::empty({tokens, out_features}, DType::f32), y2 = y1.clone(), y = y1.clone();
  reference::linear(y1, x1, weight, Tensor());
  reference::linear(y2, x2, weight, Tensor());
  reference::linear(y, Tensor::from_floats(combined, {tokens, in_features}), weight, Tensor());
  std::vector<double> expected = y1.to_doubles();
  const std::vector<double> w2 = y2.to_doubles();
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = a * expected[i] + b * w2[i];
  RC_ASSERT(mismatch(y.to_doubles(), expected, 0.0, 0.0) == std::string());
}

TEST(ReferenceLinear, RejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({2, 3}, DType::f32), out = Tensor::empty({2, 4}, DType::f32);
  std::string msg = error_of([&] { reference::linear(out, x, Tensor::zeros({4, 5}, DType::f32), Tensor()); });
  EXPECT_TRUE(contains(msg, "reference::linear") && contains(msg, "argument 'weight'")) << msg;
  msg = error_of([&] { reference::linear(out, x, Tensor::zeros({4, 3}, DType::f32), Tensor::zeros({3}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "argument 'bias'")) << msg;
  Tensor wrong_out = Tensor::empty({2, 5}, DType::f32);
  msg = error_of([&] { reference::linear(wrong_out, x, Tensor::zeros({4, 3}, DType::f32), Tensor()); });
  EXPECT_TRUE(contains(msg, "argument 'out'")) << msg;
  msg = error_of([&] {
    reference::linear(out, Tensor::zeros({6}, DType::f32), Tensor::zeros({4, 3}, DType::f32), Tensor());
  });
  EXPECT_TRUE(contains(msg, "argument 'x'") && contains(msg, "2-D")) << msg;
}

// ---- reshape_and_cache ----

namespace {

// Overwrites element `index` of a contiguous f32, f16 or bf16 tensor with raw bits.
void set_bits(Tensor& t, int64_t index, uint32_t f32_bits, uint16_t f16_bits, uint16_t bf16_bits) {
  char* base = static_cast<char*>(t.data_ptr());
  if (t.dtype() == DType::f32) {
    std::memcpy(base + 4 * index, &f32_bits, 4);
  } else {
    const uint16_t bits = t.dtype() == DType::f16 ? f16_bits : bf16_bits;
    std::memcpy(base + 2 * index, &bits, 2);
  }
}

}  // namespace

RC_GTEST_PROP(ReferenceReshapeAndCache, WritesExactlyTheAddressedSlots, ()) {
  const int64_t num_blocks = *rc::gen::inRange<int64_t>(1, 6), block_size = *rc::gen::element<int64_t>(1, 3, 16);
  const int64_t heads = *rc::gen::inRange<int64_t>(1, 4), head_size = *rc::gen::inRange<int64_t>(1, 12);
  const int64_t num_slots = num_blocks * block_size;
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, num_slots + 1);
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  // Distinct slots, about a third of the tokens skipped with -1.
  std::vector<int64_t> slots(static_cast<size_t>(num_slots));
  for (int64_t s = 0; s < num_slots; ++s) slots[size_t(s)] = s;
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(seed));
  slots.resize(size_t(tokens));
  for (int64_t& s : slots) {
    if (*rc::gen::inRange(0, 3) == 0) s = -1;
  }
  Tensor key = randn({tokens, heads, head_size}, dtype, seed, "k");
  Tensor value = randn({tokens, heads, head_size}, dtype, seed, "v");
  set_bits(key, 0, 0x7fa00001u, 0x7c01u, 0x7f81u);                       // a signalling NaN with a payload
  if (key.numel() > 1) set_bits(key, 1, 0x80000000u, 0x8000u, 0x8000u);  // -0
  const int64_t pad = *rc::gen::inRange<int64_t>(0, 3);
  key = with_row_gap(key, pad);
  value = with_row_gap(value, pad);
  Tensor key_cache = randn({num_blocks, block_size, heads, head_size}, dtype, seed, "kc");
  Tensor value_cache = randn({num_blocks, block_size, heads, head_size}, dtype, seed, "vc");
  std::vector<uint8_t> expected_k = raw_bytes(key_cache), expected_v = raw_bytes(value_cache);
  const size_t row_bytes = size_t(heads * head_size) * dtype_size(dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[size_t(t)] < 0) continue;
    const std::vector<uint8_t> k_row = raw_bytes(key.select(0, t)), v_row = raw_bytes(value.select(0, t));
    std::copy(k_row.begin(), k_row.end(), expected_k.begin() + ptrdiff_t(size_t(slots[size_t(t)]) * row_bytes));
    std::copy(v_row.begin(), v_row.end(), expected_v.begin() + ptrdiff_t(size_t(slots[size_t(t)]) * row_bytes));
  }
  reference::reshape_and_cache(key, value, key_cache, value_cache, Tensor::from_i64(slots, {tokens}));
  RC_ASSERT(raw_bytes(key_cache) == expected_k);
  RC_ASSERT(raw_bytes(value_cache) == expected_v);
}

TEST(ReferenceReshapeAndCache, ConvertsToTheCacheDtype) {
  // bf16 values are exact in f32, so a bf16 -> f32 store keeps every value.
  Tensor key = randn({3, 2, 5}, DType::bf16, 4, "k"), value = randn({3, 2, 5}, DType::bf16, 4, "v");
  Tensor key_cache = Tensor::zeros({2, 2, 2, 5}, DType::f32), value_cache = key_cache.clone();
  reference::reshape_and_cache(key, value, key_cache, value_cache, Tensor::from_i64({3, -1, 0}, {3}));
  EXPECT_EQ(key_cache.select(0, 1).select(0, 1).to_floats(), key.select(0, 0).to_floats());
  EXPECT_EQ(value_cache.select(0, 0).select(0, 0).to_floats(), value.select(0, 2).to_floats());
  EXPECT_EQ(key_cache.select(0, 0).select(0, 1).to_floats(), std::vector<float>(10, 0.0f));
}

TEST(ReferenceReshapeAndCache, RejectsBadSlotsAndShapes) {
  Tensor key = Tensor::zeros({3, 2, 4}, DType::bf16), value = key.clone();
  Tensor key_cache = Tensor::zeros({2, 4, 2, 4}, DType::bf16), value_cache = key_cache.clone();
  std::string msg = error_of([&] {
    reference::reshape_and_cache(key, value, key_cache, value_cache, Tensor::from_i64({0, 8, 1}, {3}));
  });
  EXPECT_TRUE(contains(msg, "reference::reshape_and_cache") && contains(msg, "'slot_mapping'") &&
              contains(msg, "token 1") && contains(msg, "8"))
      << msg;
  msg = error_of([&] {
    reference::reshape_and_cache(key, value, key_cache, value_cache, Tensor::from_i32({0, 1, -2}, {3}));
  });
  EXPECT_TRUE(contains(msg, "token 2")) << msg;
  EXPECT_EQ(raw_bytes(key_cache), raw_bytes(Tensor::zeros({2, 4, 2, 4}, DType::bf16)));  // nothing written
  Tensor narrow_cache = Tensor::zeros({2, 4, 1, 4}, DType::bf16);
  msg = error_of([&] {
    reference::reshape_and_cache(key, value, narrow_cache, narrow_cache, Tensor::from_i64({0, 1, 2}, {3}));
  });
  EXPECT_TRUE(contains(msg, "'key_cache'") && contains(msg, "num_kv_heads")) << msg;
}

// ---- paged attention ----

namespace {

// A batch of sequences' keys and values kept dense (for direct computation) and stored in a paged cache.
struct PagedKv {
  std::vector<Tensor> keys, values;  // per sequence: [seq_len, num_kv_heads, head_size]
  Tensor key_cache, value_cache;     // [num_blocks, block_size, num_kv_heads, head_size]
  Tensor block_tables;               // [num_seqs, max_blocks_per_seq] i32
  Tensor seq_lens;                   // [num_seqs] i32
};

// Random keys and values for each sequence length.
PagedKv random_kv(const std::vector<int64_t>& seq_lens, int64_t num_kv_heads, int64_t head_size, DType dtype,
                  uint64_t seed) {
  PagedKv kv;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    kv.keys.push_back(randn({seq_lens[b], num_kv_heads, head_size}, dtype, seed + b, "k"));
    kv.values.push_back(randn({seq_lens[b], num_kv_heads, head_size}, dtype, seed + b, "v"));
  }
  return kv;
}

// Stores kv.keys / kv.values through reference::reshape_and_cache into a NaN-filled cache with two spare blocks,
// logical blocks placed at physical blocks shuffled by placement_seed. Unused block-table entries hold an id
// outside the cache, and the NaN in unused rows makes any read beyond seq_len visible.
void store_paged(PagedKv& kv, int64_t block_size, uint64_t placement_seed) {
  const int64_t num_seqs = int64_t(kv.keys.size());
  const int64_t num_kv_heads = kv.keys[0].size(1), head_size = kv.keys[0].size(2);
  std::vector<int64_t> blocks_of(static_cast<size_t>(num_seqs));
  int64_t used = 0, max_blocks = 1;
  for (int64_t b = 0; b < num_seqs; ++b) {
    blocks_of[size_t(b)] = (kv.keys[size_t(b)].size(0) + block_size - 1) / block_size;
    used += blocks_of[size_t(b)];
    max_blocks = std::max(max_blocks, blocks_of[size_t(b)] + 1);
  }
  const int64_t num_blocks = used + 2;
  std::vector<int64_t> physical(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) physical[size_t(i)] = i;
  std::shuffle(physical.begin(), physical.end(), std::mt19937_64(placement_seed));

  const DType dtype = kv.keys[0].dtype();
  kv.key_cache = Tensor::full({num_blocks, block_size, num_kv_heads, head_size}, kNaN, dtype);
  kv.value_cache = Tensor::full({num_blocks, block_size, num_kv_heads, head_size}, kNaN, dtype);
  std::vector<int32_t> table(size_t(num_seqs * max_blocks), int32_t(num_blocks + 1000)), lens;
  int64_t next = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t seq_len = kv.keys[size_t(b)].size(0);
    lens.push_back(int32_t(seq_len));
    for (int64_t j = 0; j < blocks_of[size_t(b)]; ++j)
      table[size_t(b * max_blocks + j)] = int32_t(physical[size_t(next++)]);
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < seq_len; ++p)
      slots.push_back(table[size_t(b * max_blocks + p / block_size)] * block_size + p % block_size);
    reference::reshape_and_cache(kv.keys[size_t(b)], kv.values[size_t(b)], kv.key_cache, kv.value_cache,
                                 Tensor::from_i64(slots, {seq_len}));
  }
  kv.block_tables = Tensor::from_i32(table, {num_seqs, max_blocks});
  kv.seq_lens = Tensor::from_i32(lens, {num_seqs});
}

// Causal attention of one sequence, computed directly: q [q_len, num_heads, head_size] (query row j at position
// seq_len - q_len + j), k and v [seq_len, num_kv_heads, head_size] -> [q_len, num_heads, head_size].
std::vector<double> dense_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t q_len = q.size(0), num_heads = q.size(1), head_size = q.size(2);
  const int64_t seq_len = k.size(0), num_kv_heads = k.size(1), group = num_heads / num_kv_heads;
  const std::vector<double> qv = q.to_doubles(), kv = k.to_doubles(), vv = v.to_doubles();
  auto qe = [&](int64_t j, int64_t h, int64_t d) { return qv[size_t((j * num_heads + h) * head_size + d)]; };
  auto ke = [&](int64_t p, int64_t h, int64_t d) { return kv[size_t((p * num_kv_heads + h) * head_size + d)]; };
  auto ve = [&](int64_t p, int64_t h, int64_t d) { return vv[size_t((p * num_kv_heads + h) * head_size + d)]; };
  std::vector<double> out(size_t(q_len * num_heads * head_size), 0.0);
  for (int64_t j = 0; j < q_len; ++j) {
    const int64_t last = seq_len - q_len + j;
    for (int64_t h = 0; h < num_heads; ++h) {
      std::vector<double> logits;
      for (int64_t p = 0; p <= last; ++p) {
        double dot = 0;
        for (int64_t d = 0; d < head_size; ++d) dot += qe(j, h, d) * ke(p, h / group, d);
        logits.push_back(scale * dot);
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (double s : logits) z += std::exp(s - m);
      const double log_sum_exp = m + std::log(z);
      for (int64_t p = 0; p <= last; ++p) {
        const double prob = std::exp(logits[size_t(p)] - log_sum_exp);
        for (int64_t d = 0; d < head_size; ++d)
          out[size_t((j * num_heads + h) * head_size + d)] += prob * ve(p, h / group, d);
      }
    }
  }
  return out;
}

struct AttentionCase {
  int64_t num_kv_heads, num_heads, head_size, block_size;
  std::vector<int64_t> seq_lens;
  DType dtype;
  uint64_t seed;
  double scale() const { return 1.0 / std::sqrt(double(head_size)); }
};

AttentionCase gen_attention_case(int64_t max_seqs) {
  AttentionCase c;
  c.num_kv_heads = *rc::gen::inRange<int64_t>(1, 4);
  c.num_heads = c.num_kv_heads * *rc::gen::inRange<int64_t>(1, 4);
  c.head_size = *rc::gen::inRange<int64_t>(1, 20);
  c.block_size = *rc::gen::element<int64_t>(1, 2, 3, 5, 16);
  const int64_t num_seqs = *rc::gen::inRange<int64_t>(1, max_seqs + 1);
  for (int64_t b = 0; b < num_seqs; ++b) c.seq_lens.push_back(*rc::gen::inRange<int64_t>(1, 40));
  c.dtype = float_dtype(*rc::gen::inRange(0, 3));
  c.seed = *rc::gen::arbitrary<uint64_t>();
  RC_LOG() << "heads " << c.num_heads << "/" << c.num_kv_heads << " head_size " << c.head_size << " block_size "
           << c.block_size << " dtype " << dtype_name(c.dtype) << " seq_lens";
  for (int64_t s : c.seq_lens) RC_LOG() << " " << s;
  RC_LOG() << "\n";
  return c;
}

// Stacks per-sequence rows [n_b, ...] into one [sum n_b, ...] tensor; also returns query_start_loc.
std::pair<Tensor, Tensor> concat_rows(const std::vector<Tensor>& parts) {
  int64_t total = 0;
  std::vector<int32_t> starts = {0};
  for (const Tensor& p : parts) starts.push_back(int32_t(total += p.size(0)));
  Shape shape = parts[0].shape();
  shape[0] = total;
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  for (size_t b = 0; b < parts.size(); ++b) {
    if (parts[b].size(0) > 0) out.slice(0, starts[b], starts[b + 1]).copy_(parts[b]);
  }
  return {out, Tensor::from_i32(starts, {int64_t(starts.size())})};
}

Tensor prefill(const Tensor& q, const Tensor& query_start_loc, const PagedKv& kv, double scale) {
  Tensor out = Tensor::full(q.shape(), kNaN, DType::f32);
  reference::paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, query_start_loc, kv.seq_lens,
                                     kv.block_tables, scale);
  return out;
}

}  // namespace

RC_GTEST_PROP(ReferenceAttention, PrefillOfOneSequenceEqualsDenseCausalSoftmax, ()) {
  const AttentionCase c = gen_attention_case(1);
  PagedKv kv = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  store_paged(kv, c.block_size, c.seed);
  // q as a strided slice of a wider (fused qkv) tensor.
  Tensor q = with_row_gap(randn({c.seq_lens[0], c.num_heads, c.head_size}, c.dtype, c.seed, "q"),
                          *rc::gen::inRange<int64_t>(0, 2) * 2 * c.num_kv_heads * c.head_size);
  Tensor out = prefill(q, Tensor::from_i32({0, int32_t(c.seq_lens[0])}, {2}), kv, c.scale());
  RC_ASSERT(mismatch(out.to_doubles(), dense_causal_attention(q, kv.keys[0], kv.values[0], c.scale()), 1e-6, 1e-6) ==
            std::string());
}

RC_GTEST_PROP(ReferenceAttention, BatchEqualsEachSequenceAlone, ()) {
  const AttentionCase c = gen_attention_case(4);
  PagedKv kv = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  store_paged(kv, c.block_size, c.seed);
  // Each sequence queries a random-length suffix of itself (chunked prefill), possibly empty.
  std::vector<Tensor> queries;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    const int64_t q_len = *rc::gen::inRange<int64_t>(0, c.seq_lens[b] + 1);
    queries.push_back(randn({q_len, c.num_heads, c.head_size}, c.dtype, c.seed + b, "q"));
  }
  auto [q, query_start_loc] = concat_rows(queries);
  const std::vector<double> batched = prefill(q, query_start_loc, kv, c.scale()).to_doubles();
  std::vector<double> expected;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    const std::vector<double> alone = dense_causal_attention(queries[b], kv.keys[b], kv.values[b], c.scale());
    expected.insert(expected.end(), alone.begin(), alone.end());
  }
  RC_ASSERT(mismatch(batched, expected, 1e-6, 1e-6) == std::string());
}

RC_GTEST_PROP(ReferenceAttention, DecodeEqualsLastRowOfPrefill, ()) {
  const AttentionCase c = gen_attention_case(4);
  PagedKv kv = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  store_paged(kv, c.block_size, c.seed);
  std::vector<Tensor> full_queries, last_rows;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    full_queries.push_back(randn({c.seq_lens[b], c.num_heads, c.head_size}, c.dtype, c.seed + b, "q"));
    last_rows.push_back(full_queries.back().slice(0, c.seq_lens[b] - 1, c.seq_lens[b]));
  }
  auto [q_full, query_start_loc] = concat_rows(full_queries);
  const Tensor full = prefill(q_full, query_start_loc, kv, c.scale());
  Tensor q_decode = concat_rows(last_rows).first;
  Tensor decoded = Tensor::full(q_decode.shape(), kNaN, DType::f32);
  reference::paged_attention_decode(decoded, q_decode, kv.key_cache, kv.value_cache, kv.seq_lens, kv.block_tables,
                                    c.scale());
  const std::vector<int64_t> starts = query_start_loc.to_ints();
  std::vector<Tensor> expected_rows;
  for (size_t b = 0; b < c.seq_lens.size(); ++b)
    expected_rows.push_back(full.slice(0, starts[b + 1] - 1, starts[b + 1]));
  RC_ASSERT(mismatch(decoded.to_doubles(), concat_rows(expected_rows).first.to_doubles(), 1e-6, 1e-6) == std::string());
}

RC_GTEST_PROP(ReferenceAttention, ChunkedPrefillEqualsRowsOfFullPrefill, ()) {
  const AttentionCase c = gen_attention_case(3);
  PagedKv kv = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  store_paged(kv, c.block_size, c.seed);
  std::vector<Tensor> full_queries, chunks;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    const int64_t chunk = *rc::gen::inRange<int64_t>(0, c.seq_lens[b] + 1);
    full_queries.push_back(randn({c.seq_lens[b], c.num_heads, c.head_size}, c.dtype, c.seed + b, "q"));
    chunks.push_back(full_queries.back().slice(0, c.seq_lens[b] - chunk, c.seq_lens[b]));
  }
  auto [q_full, full_starts] = concat_rows(full_queries);
  auto [q_chunks, chunk_starts] = concat_rows(chunks);
  const Tensor full = prefill(q_full, full_starts, kv, c.scale());
  const Tensor chunked = prefill(q_chunks, chunk_starts, kv, c.scale());
  const std::vector<int64_t> fs = full_starts.to_ints(), cs = chunk_starts.to_ints();
  std::vector<Tensor> expected_rows;
  for (size_t b = 0; b < c.seq_lens.size(); ++b)
    expected_rows.push_back(full.slice(0, fs[b + 1] - (cs[b + 1] - cs[b]), fs[b + 1]));
  RC_ASSERT(mismatch(chunked.to_doubles(), concat_rows(expected_rows).first.to_doubles(), 1e-6, 1e-6) == std::string());
}

RC_GTEST_PROP(ReferenceAttention, GqaEqualsMhaWithRepeatedKvHeads, ()) {
  const AttentionCase c = gen_attention_case(2);
  const int64_t group = c.num_heads / c.num_kv_heads;
  PagedKv gqa = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  PagedKv mha;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    // kv head g serves query heads g * group .. g * group + group - 1: repeat it that many times.
    auto repeat = [&](const Tensor& t) {
      Tensor r = Tensor::empty({c.seq_lens[b], c.num_heads, c.head_size}, c.dtype);
      for (int64_t h = 0; h < c.num_heads; ++h) r.select(1, h).copy_(t.select(1, h / group));
      return r;
    };
    mha.keys.push_back(repeat(gqa.keys[b]));
    mha.values.push_back(repeat(gqa.values[b]));
  }
  store_paged(gqa, c.block_size, c.seed);
  store_paged(mha, c.block_size, c.seed + 1);
  std::vector<Tensor> queries;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    queries.push_back(randn({c.seq_lens[b], c.num_heads, c.head_size}, c.dtype, c.seed + b, "q"));
  }
  auto [q, query_start_loc] = concat_rows(queries);
  RC_ASSERT(mismatch(prefill(q, query_start_loc, gqa, c.scale()).to_doubles(),
                     prefill(q, query_start_loc, mha, c.scale()).to_doubles(), 1e-6, 1e-6) == std::string());
}

RC_GTEST_PROP(ReferenceAttention, InvariantToPhysicalBlockPlacement, ()) {
  const AttentionCase c = gen_attention_case(3);
  PagedKv in_order = random_kv(c.seq_lens, c.num_kv_heads, c.head_size, c.dtype, c.seed);
  PagedKv shuffled = in_order;
  store_paged(in_order, c.block_size, c.seed);
  store_paged(shuffled, c.block_size, *rc::gen::arbitrary<uint64_t>());
  RC_LOG() << "block tables " << shuffled.block_tables.str() << "\n";
  std::vector<Tensor> queries;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    queries.push_back(randn({c.seq_lens[b], c.num_heads, c.head_size}, c.dtype, c.seed + b, "q"));
  }
  auto [q, query_start_loc] = concat_rows(queries);
  RC_ASSERT(raw_bytes(prefill(q, query_start_loc, in_order, c.scale())) ==
            raw_bytes(prefill(q, query_start_loc, shuffled, c.scale())));
  Tensor q_decode = q.slice(0, 0, int64_t(c.seq_lens.size()));
  Tensor a = Tensor::empty(q_decode.shape(), DType::bf16), b = a.clone();
  reference::paged_attention_decode(a, q_decode, in_order.key_cache, in_order.value_cache, in_order.seq_lens,
                                    in_order.block_tables, c.scale());
  reference::paged_attention_decode(b, q_decode, shuffled.key_cache, shuffled.value_cache, shuffled.seq_lens,
                                    shuffled.block_tables, c.scale());
  RC_ASSERT(raw_bytes(a) == raw_bytes(b));
}

TEST(ReferenceAttention, EqualKeysAverageTheVisibleValues) {
  // With every key equal, softmax is uniform: query row j (position j) gets the mean of values 0..j.
  const int64_t seq_len = 7, head_size = 3;
  PagedKv kv;
  kv.keys.push_back(Tensor::full({seq_len, 1, head_size}, 0.5, DType::f32));
  std::vector<float> values;
  for (int64_t p = 0; p < seq_len; ++p) values.insert(values.end(), {float(p), float(10 * p), -1.0f});
  kv.values.push_back(Tensor::from_floats(values, {seq_len, 1, head_size}));
  store_paged(kv, 3, 5);
  Tensor q = randn({seq_len, 2, head_size}, DType::f32, 5, "q");
  const std::vector<float> out = prefill(q, Tensor::from_i32({0, int32_t(seq_len)}, {2}), kv, 0.7).to_floats();
  for (int64_t j = 0; j < seq_len; ++j) {
    for (int64_t h = 0; h < 2; ++h) {
      const size_t o = size_t((j * 2 + h) * head_size);
      EXPECT_FLOAT_EQ(out[o], float(j) / 2);
      EXPECT_FLOAT_EQ(out[o + 1], 10.0f * float(j) / 2);
      EXPECT_FLOAT_EQ(out[o + 2], -1.0f);
    }
  }
}

TEST(ReferenceAttention, RejectsInconsistentMetadata) {
  PagedKv kv = random_kv({5, 9}, 2, 8, DType::bf16, 11);
  store_paged(kv, 4, 11);  // block_tables [2, 4]
  Tensor q = randn({14, 4, 8}, DType::bf16, 11, "q");
  Tensor out = Tensor::empty({14, 4, 8}, DType::bf16);
  Tensor qsl = Tensor::from_i32({0, 5, 14}, {3});
  auto run = [&](const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables) {
    return error_of([&] {
      reference::paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, query_start_loc, seq_lens, block_tables,
                                         0.3);
    });
  };
  EXPECT_EQ(run(qsl, kv.seq_lens, kv.block_tables), "<no error>");

  std::string msg = run(qsl, Tensor::from_i32({5, 17}, {2}), kv.block_tables);  // 17 keys need 5 blocks of 4
  EXPECT_TRUE(contains(msg, "reference::paged_attention_prefill") && contains(msg, "'block_tables'") &&
              contains(msg, "sequence 1"))
      << msg;
  msg = run(qsl, Tensor::from_i32({4, 9}, {2}), kv.block_tables);  // 5 query rows, 4 keys
  EXPECT_TRUE(contains(msg, "'seq_lens'") && contains(msg, "sequence 0")) << msg;
  msg = run(Tensor::from_i32({0, 5, 13}, {3}), kv.seq_lens, kv.block_tables);
  EXPECT_TRUE(contains(msg, "'query_start_loc'")) << msg;
  Tensor bad_table = kv.block_tables.clone();
  bad_table.data<int32_t>()[1] = -3;  // sequence 0, block 1 (used: 5 keys span 2 blocks)
  msg = run(qsl, kv.seq_lens, bad_table);
  EXPECT_TRUE(contains(msg, "'block_tables'") && contains(msg, "[0, 1]")) << msg;
  msg = run(qsl, kv.seq_lens, Tensor::from_floats({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}));
  EXPECT_TRUE(contains(msg, "'block_tables'") && contains(msg, "i32")) << msg;

  Tensor q3 = randn({14, 3, 8}, DType::bf16, 11, "q"), out3 = Tensor::empty({14, 3, 8}, DType::bf16);
  msg = error_of([&] {
    reference::paged_attention_prefill(out3, q3, kv.key_cache, kv.value_cache, qsl, kv.seq_lens, kv.block_tables, 0.3);
  });
  EXPECT_TRUE(contains(msg, "'key_cache'") && contains(msg, "divide")) << msg;

  Tensor q_decode = randn({2, 4, 8}, DType::bf16, 11, "q"), out_decode = Tensor::empty({2, 4, 8}, DType::bf16);
  msg = error_of([&] {
    reference::paged_attention_decode(out_decode, q_decode, kv.key_cache, kv.value_cache, Tensor::from_i32({0, 9}, {2}),
                                      kv.block_tables, 0.3);
  });
  EXPECT_TRUE(contains(msg, "reference::paged_attention_decode") && contains(msg, "'seq_lens'")) << msg;
  msg = error_of([&] {
    reference::paged_attention_decode(out, q_decode, kv.key_cache, kv.value_cache, kv.seq_lens, kv.block_tables, 0.3);
  });
  EXPECT_TRUE(contains(msg, "'out'")) << msg;
}

// ---- argmax ----

TEST(ReferenceArgmax, TiesNaNAndInfinities) {
  const std::vector<std::pair<std::vector<float>, int64_t>> rows = {
      {{1, 3, 3, 2}, 1},                                          // tie: lowest index
      {{float(kNaN), 1, float(kNaN), 1}, 1},                      // NaN never wins
      {{float(kNaN), float(kNaN), float(kNaN), float(kNaN)}, 0},  // all NaN
      {{-float(kInf), -float(kInf), -float(kInf), -float(kInf)}, 0},
      {{float(kNaN), -float(kInf), float(kNaN), -5}, 3},
      {{float(kInf), float(kNaN), float(kInf), 1e30f}, 0},
      {{-1, float(kNaN), -0.5, -0.75}, 2},
  };
  std::vector<float> logits;
  std::vector<int64_t> expected;
  for (const auto& [row, index] : rows) {
    logits.insert(logits.end(), row.begin(), row.end());
    expected.push_back(index);
  }
  const int64_t n = int64_t(rows.size());
  for (DType dtype : kFloatDTypes) {
    Tensor out = Tensor::full({n}, -7, DType::i64);
    reference::argmax(out, Tensor::from_floats(logits, {n, 4}, dtype));
    EXPECT_EQ(out.to_ints(), expected) << dtype_name(dtype);
  }
}

RC_GTEST_PROP(ReferenceArgmax, PicksTheFirstMaximum, ()) {
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 6);
  const int64_t vocab = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 50), rc::gen::just<int64_t>(5125));
  const DType dtype = float_dtype(*rc::gen::inRange(0, 3));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  // Few distinct values, so ties are common.
  Tensor ints = Tensor::empty({tokens, vocab}, DType::i32);
  fill_randint_(ints, hash_seed(seed, "logits"), -4, 5);
  Tensor logits = with_row_gap(ints.to(dtype), *rc::gen::inRange<int64_t>(0, 4));
  Tensor out = Tensor::empty({tokens}, DType::i64);
  reference::argmax(out, logits);
  const std::vector<double> x = logits.to_doubles();
  const std::vector<int64_t> best = out.to_ints();
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = &x[size_t(t * vocab)];
    const int64_t b = best[size_t(t)];
    RC_ASSERT(b >= 0 && b < vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      // Entries before the winner are strictly smaller, those after it are not larger.
      const bool ok = v < b ? row[v] < row[b] : row[v] <= row[b];
      RC_ASSERT(ok);
    }
  }
}

TEST(ReferenceArgmax, RejectsBadOutput) {
  Tensor logits = Tensor::zeros({2, 5}, DType::f32);
  Tensor out_i32 = Tensor::empty({2}, DType::i32);
  std::string msg = error_of([&] { reference::argmax(out_i32, logits); });
  EXPECT_TRUE(contains(msg, "reference::argmax") && contains(msg, "'out'") && contains(msg, "i64")) << msg;
  Tensor out_short = Tensor::empty({1}, DType::i64);
  msg = error_of([&] { reference::argmax(out_short, logits); });
  EXPECT_TRUE(contains(msg, "'out'") && contains(msg, "num_tokens")) << msg;
  Tensor out = Tensor::empty({2}, DType::i64);
  msg = error_of([&] { reference::argmax(out, Tensor::zeros({2, 0}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "'logits'") && contains(msg, "vocab")) << msg;
}

// ---- every op refuses device tensors ----

TEST(ReferenceOps, RefuseNonCpuTensorsNamingTheArgument) {
  // A tensor that claims to live on a GPU; the refusal must come before anything reads it.
  std::vector<float> host(64, 0.0f);
  Tensor on_gpu = Tensor::from_blob(host.data(), {4, 16}, DType::f32, Device::cuda(0));
  Tensor cpu = Tensor::zeros({4, 16}, DType::f32), out = Tensor::empty({4, 16}, DType::f32);
  std::string msg = error_of([&] { reference::linear(out, cpu, on_gpu, Tensor()); });
  EXPECT_TRUE(contains(msg, "reference::linear") && contains(msg, "'weight'") && contains(msg, "CPU")) << msg;
  Tensor half_out = Tensor::empty({4, 8}, DType::f32);
  msg = error_of([&] { reference::silu_and_mul(half_out, on_gpu); });
  EXPECT_TRUE(contains(msg, "'x'") && contains(msg, "CPU")) << msg;
  Tensor ids_out = Tensor::empty({4}, DType::i64);
  msg = error_of([&] { reference::argmax(ids_out, on_gpu); });
  EXPECT_TRUE(contains(msg, "'logits'") && contains(msg, "CPU")) << msg;
  Tensor positions = Tensor::zeros({4}, DType::i64);
  msg = error_of([&] {
    reference::rotary_embedding(positions, on_gpu, cpu, 16, reference::rope_cos_sin_cache(8, 4, 1e4, {}), true);
  });
  EXPECT_TRUE(contains(msg, "'query'") && contains(msg, "CPU")) << msg;
}
