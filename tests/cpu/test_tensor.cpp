#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"

using namespace kbn;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(DType, F16MatchesKnownEncodings) {
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f).bits, 0x7c00);                    // overflow -> inf
  EXPECT_EQ(float_to_f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
  for (uint16_t b : {0x3c00, 0x0001, 0x03ff, 0x7bff, 0xbc01}) EXPECT_EQ(float_to_f16(f16_to_float(f16_t{b})).bits, b);
}

TEST(DType, Fp8E4M3) {
  EXPECT_EQ(fp8e4m3_to_float(fp8e4m3_t{0x7e}), 448.0f);
  EXPECT_EQ(float_to_fp8e4m3(1000.0f).bits, 0x7e);  // saturates
  EXPECT_EQ(fp8e4m3_to_float(float_to_fp8e4m3(1.0f)), 1.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(fp8e4m3_t{0x7f})));
}

// float_to_fp8e4m3 rounds to the nearest code, ties to the even code, saturating at +-448: checked against a plain
// scan of every code at each code, each midpoint between neighbours and a float either side of both, every f16
// value, and signed zeros.
TEST(DType, Fp8E4M3RoundsToNearestEvenEverywhere) {
  auto scan = [](float f) {
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    const float a = std::fabs(f);
    if (a >= 448.0f) return uint8_t(sign | 0x7e);
    uint8_t best = 0;
    float best_err = a;
    for (uint8_t c = 1; c < 0x7f; ++c) {
      const float err = std::fabs(fp8e4m3_to_float(fp8e4m3_t{c}) - a);
      if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
        best = c;
        best_err = err;
      }
    }
    return uint8_t(sign | best);
  };
  std::vector<float> probes;
  for (int c = 0; c < 0x7f; ++c) {
    const float v = fp8e4m3_to_float(fp8e4m3_t{uint8_t(c)});
    const float mid = c + 1 < 0x7f ? (v + fp8e4m3_to_float(fp8e4m3_t{uint8_t(c + 1)})) / 2 : 460.0f;
    for (const float x : {v, mid}) probes.insert(probes.end(), {x, std::nextafter(x, 0.f), std::nextafter(x, 1e9f)});
  }
  for (uint32_t b = 0; b < 0x7c00; ++b) probes.push_back(f16_to_float(f16_t{uint16_t(b)}));
  for (const float x : probes) {
    for (const float f : {x, -x}) ASSERT_EQ(float_to_fp8e4m3(f).bits, scan(f)) << f;
  }
  EXPECT_EQ(float_to_fp8e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(float_to_fp8e4m3(0.0f).bits, 0x00);
}

TEST(DType, ParseNamesTheBadValue) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("torch.float16"), DType::f16);
  try {
    parse_dtype("float13");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float13"), std::string::npos);
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_floats({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape(), (Shape{3}));
  row.fill_(9);
  EXPECT_EQ(t.to_floats(), (std::vector<float>{0, 1, 2, 9, 9, 9}));
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.contiguous().to_floats(), (std::vector<float>{0, 9, 1, 9, 2, 9}));
  Tensor col = t.slice(1, 1, 3);
  EXPECT_EQ(col.to_floats(), (std::vector<float>{1, 2, 9, 9}));
  EXPECT_EQ(t.view({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_THROW(tt.view({6}), Error);
  EXPECT_EQ(tt.reshape({6}).to_floats(), (std::vector<float>{0, 9, 1, 9, 2, 9}));
}

TEST(Tensor, CopyConvertsDtypesAndStrides) {
  Tensor src = Tensor::from_floats({1.5f, -2.25f, 3.0f, 4.0f}, {2, 2});
  Tensor dst = Tensor::empty({2, 2}, DType::bf16);
  dst.copy_(src.transpose(0, 1));
  EXPECT_EQ(dst.to_floats(), (std::vector<float>{1.5f, 3.0f, -2.25f, 4.0f}));
  EXPECT_THROW(dst.copy_(Tensor::empty({3}, DType::f32)), Error);
}

TEST(Tensor, BoundsAreChecked) {
  Tensor t = Tensor::zeros({4, 4}, DType::f32);
  EXPECT_THROW(t.slice(0, 2, 5), Error);
  EXPECT_THROW(t.select(1, 4), Error);
  EXPECT_THROW(t.size(2), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(t.as_strided({4, 5}, {5, 1}, 0), Error);
  EXPECT_THROW(Tensor::empty({-1}, DType::f32), Error);
}

TEST(Tensor, CudaWithoutGpuFailsClearly) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  try {
    Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos);
  }
}

TEST(Checks, MessagesNameOpArgumentAndExpectation) {
  Tensor x = Tensor::zeros({4}, DType::bf16);
  try {
    check_rank(x, "rms_norm", "x", 2, "[num_tokens, hidden_size]");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rms_norm"), std::string::npos);
    EXPECT_NE(m.find("'x'"), std::string::npos);
    EXPECT_NE(m.find("2-D"), std::string::npos);
    EXPECT_NE(m.find("bf16[4]"), std::string::npos);
  }
  EXPECT_THROW(check_dtype(x, "op", "x", {DType::f32, DType::f16}), Error);
}

TEST(Rng, DeterministicAndWellScaled) {
  Tensor a = Tensor::empty({10000}, DType::f32), b = Tensor::empty({10000}, DType::f32);
  fill_normal_(a, 7, 0.0, 2.0);
  fill_normal_(b, 7, 0.0, 2.0);
  EXPECT_EQ(a.to_floats(), b.to_floats());
  double s = 0, ss = 0;
  for (float v : a.to_floats()) {
    s += v;
    ss += double(v) * v;
  }
  double mean = s / 1e4, var = ss / 1e4 - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.1);
  Tensor c = Tensor::empty({10000}, DType::f32);
  fill_normal_(c, 8, 0.0, 2.0);
  EXPECT_NE(a.to_floats(), c.to_floats());
  Tensor ids = Tensor::empty({1000}, DType::i64);
  fill_randint_(ids, 1, 5, 9);
  for (int64_t v : ids.to_ints()) EXPECT_TRUE(v >= 5 && v < 9);
}
