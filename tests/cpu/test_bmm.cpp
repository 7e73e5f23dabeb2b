// bmm (MLA's per-head absorbed up-projections) on CPU tensors: per-head strided views in and out against a direct
// double loop written here (not the oracle the CPU path calls), nothing outside out's view written, M = 0 a no-op,
// every refused argument named, and the op's cases (views into token-major tensors) through the validation contract
// at tiny-deepseek-v2's and DeepSeek-V2-Lite's shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "L1/bmm.h"
#include "kbn/rng.h"
#include "op_contract.h"
#include "test_errors.h"

namespace {

using namespace kbn;
using namespace kbn::baseline;
using kbn::test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Tensor randn(const Shape& s, uint64_t seed, DType dt = DType::f32) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal_(t, seed, 0.0, 1.0);
  return dt == DType::f32 ? t : t.to(dt);
}

// out[b, m, n] = sum_k x[b, m, k] w[b, n, k] in double, from the views' logical elements.
std::vector<double> direct_bmm(const Tensor& x, const Tensor& w) {
  const int64_t B = x.size(0), M = x.size(1), K = x.size(2), N = w.size(1);
  const std::vector<double> xv = x.to_doubles(), wv = w.to_doubles();
  std::vector<double> out(size_t(B * M * N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += xv[size_t((b * M + m) * K + k)] * wv[size_t((b * N + n) * K + k)];
        out[size_t((b * M + m) * N + n)] = acc;
      }
  return out;
}

// MLA's W_UK product at a small odd shape: x = per-head view of q [T, H, P + R] (columns [0, P) of each head),
// out = per-head view of [T, H, W] (columns [0, L) of each head, W > L), weight [H, L, P].
void check_strided_views(DType dt, double rtol) {
  const int64_t T = 5, H = 3, P = 7, R = 2, L = 6, W = L + 3;
  const Tensor q = randn({T, H, P + R}, 11, dt);
  const Tensor x = q.as_strided({H, T, P}, {P + R, H * (P + R), 1}, q.offset());
  const Tensor weight = randn({H, L, P}, 12, dt);
  const Tensor wide = Tensor::full({T, H, W}, 7.0, dt);
  const Tensor out = wide.as_strided({H, T, L}, {W, H * W, 1}, wide.offset());
  const std::vector<double> q_before = q.to_doubles();

  Bmm().forward(x, weight, out);

  const std::vector<double> want = direct_bmm(x, weight), got = out.to_doubles();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i]) + 1e-6) << "element " << i << " in " << dtype_name(dt);
  // The columns [L, W) of every head of every token are not out's: they keep their bytes.
  const std::vector<double> all = wide.to_doubles();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = L; c < W; ++c) EXPECT_EQ(all[size_t((t * H + h) * W + c)], 7.0) << t << " " << h << " " << c;
  EXPECT_EQ(q.to_doubles(), q_before);  // x is read only
}

TEST(Bmm, CpuMatchesADoubleLoopOnPerHeadViewsF32) { check_strided_views(DType::f32, 1e-5); }

TEST(Bmm, CpuMatchesADoubleLoopOnPerHeadViewsBf16) {
  // The exact sum rounded once to bf16: within half an ulp (2^-9 relative), a little slack on top.
  check_strided_views(DType::bf16, 1.0 / 128);
}

TEST(Bmm, ContiguousOperandsAndOneBatch) {
  const Tensor x = randn({1, 4, 9}, 21), weight = randn({1, 5, 9}, 22);
  const Tensor out = Tensor::zeros({1, 4, 5}, DType::f32);
  Bmm().forward(x, weight, out);
  const std::vector<double> want = direct_bmm(x, weight), got = out.to_doubles();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-6);
}

TEST(Bmm, NoTokensIsANoOp) {
  const int64_t H = 3, P = 4, L = 6;
  const Tensor q = randn({0, H, P}, 31);
  const Tensor x = q.as_strided({H, 0, P}, {P, H * P, 1}, 0);
  const Tensor out = Tensor::empty({0, H, L}, DType::f32).as_strided({H, 0, L}, {L, H * L, 1}, 0);
  EXPECT_NO_THROW(Bmm().forward(x, randn({H, L, P}, 32), out));
  EXPECT_NO_THROW(Bmm().forward(Tensor::empty({H, 0, P}, DType::bf16), randn({H, L, P}, 33, DType::bf16),
                                Tensor::empty({H, 0, L}, DType::bf16)));
}

TEST(Bmm, RefusesBadArgumentsNamingThem) {
  const int64_t B = 2, M = 3, K = 4, N = 5;
  const Tensor x = randn({B, M, K}, 41), w = randn({B, N, K}, 42), out = Tensor::zeros({B, M, N}, DType::f32);
  auto err = [](const Tensor& x, const Tensor& w, const Tensor& o) {
    return error_of([&] { Bmm().forward(x, w, o); });
  };

  std::string m = err(randn({M, K}, 1), w, out);  // wrong rank
  EXPECT_TRUE(contains(m, "bmm") && contains(m, "'x'") && contains(m, "3-D")) << m;
  m = err(x, randn({N, K}, 1), out);
  EXPECT_TRUE(contains(m, "'weight'") && contains(m, "3-D")) << m;
  m = err(x, w, Tensor::zeros({M, N}, DType::f32));
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "3-D")) << m;

  m = err(x, randn({B + 1, N, K}, 1), out);  // batch mismatch
  EXPECT_TRUE(contains(m, "'weight'") && contains(m, "batch")) << m;
  m = err(x, randn({B, N, K + 1}, 1), out);  // K mismatch
  EXPECT_TRUE(contains(m, "'weight'") && contains(m, "K = x.size(2)")) << m;
  m = err(x, w, Tensor::zeros({B, M, N + 1}, DType::f32));  // N mismatch
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "N = weight.size(1)")) << m;
  m = err(x, w, Tensor::zeros({B, M + 1, N}, DType::f32));  // M mismatch
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "M = x.size(1)")) << m;

  m = err(x, w.to(DType::bf16), out);  // dtype mismatch
  EXPECT_TRUE(contains(m, "'x' and 'weight'") && contains(m, "same dtype")) << m;
  m = err(x, w, Tensor::zeros({B, M, N}, DType::bf16));
  EXPECT_TRUE(contains(m, "'x' and 'out'") && contains(m, "same dtype")) << m;
  m = err(Tensor::zeros({B, M, K}, DType::i32), Tensor::zeros({B, N, K}, DType::i32),
          Tensor::zeros({B, M, N}, DType::i32));
  EXPECT_TRUE(contains(m, "'x'") && contains(m, "dtype")) << m;

  m = err(x, randn({B, K, N}, 1).transpose(1, 2), out);  // non-contiguous weight
  EXPECT_TRUE(contains(m, "'weight'") && contains(m, "contiguous")) << m;
  m = err(randn({B, K, M}, 1).transpose(1, 2), w, out);  // x with a strided last dimension
  EXPECT_TRUE(contains(m, "'x'") && contains(m, "last dimension")) << m;
  m = err(x, w, Tensor::zeros({B, N, M}, DType::f32).transpose(1, 2));
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "last dimension")) << m;

  // Rows of out on top of each other (row stride 0) and heads on top of each other (batch stride 0).
  const Tensor flat = Tensor::zeros({B * M * N}, DType::f32);
  m = err(x, w, flat.as_strided({B, M, N}, {M * N, 0, 1}, 0));
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "overlap")) << m;
  m = err(x, w, flat.as_strided({B, M, N}, {0, N, 1}, 0));
  EXPECT_TRUE(contains(m, "'out'") && contains(m, "overlap")) << m;
  // x rows closer than K (cuBLAS needs a row stride of at least K).
  m = err(Tensor::zeros({B * M * K}, DType::f32).as_strided({B, M, K}, {M * K, K - 1, 1}, 0), w, out);
  EXPECT_TRUE(contains(m, "'x'") && contains(m, "row stride")) << m;
  m = err(x, Tensor::zeros({B, N, 0}, DType::f32), out);
  EXPECT_TRUE(contains(m, "'weight'")) << m;  // K mismatch (x has K = 4)
  m = err(Tensor::zeros({B, M, 0}, DType::f32), Tensor::zeros({B, N, 0}, DType::f32), out);
  EXPECT_TRUE(contains(m, "'weight'") && contains(m, "K > 0")) << m;
  m = err(Tensor(), w, out);
  EXPECT_TRUE(contains(m, "'x'") && contains(m, "undefined")) << m;
}

// The cases are MLA's two products on per-head views into token-major tensors.
TEST(Bmm, CasesAreMlaAbsorptionsOnPerHeadViews) {
  const engine::ModelSpec spec = engine::resolve_model("deepseek-v2-lite");
  const ModelView view = test::contract_view(spec);
  bench::CaseOptions o;
  o.tokens = {3};
  o.small = true;
  const std::vector<BenchCase> cs = bench::cases_for("bmm", view, o);
  ASSERT_EQ(cs.size(), 2u);
  EXPECT_TRUE(contains(cs[0].label, "W_UK")) << cs[0].label;
  EXPECT_TRUE(contains(cs[1].label, "W_UV")) << cs[1].label;
  const std::vector<Tensor> uk = cs[0].make_inputs(Device::cpu(), 1);
  EXPECT_EQ(uk[0].shape(), (Shape{16, 3, 128}));
  EXPECT_EQ(uk[0].strides(), (Shape{192, 16 * 192, 1}));
  EXPECT_EQ(uk[1].shape(), (Shape{16, 512, 128}));
  EXPECT_EQ(uk[2].shape(), (Shape{16, 3, 512}));
  EXPECT_EQ(uk[2].strides(), (Shape{576, 16 * 576, 1}));
  EXPECT_EQ(cs[0].flops, 2 * 16 * 3 * 512 * 128);
  const std::vector<Tensor> uv = cs[1].make_inputs(Device::cpu(), 1);
  EXPECT_EQ(uv[0].shape(), (Shape{16, 3, 512}));
  EXPECT_EQ(uv[1].shape(), (Shape{16, 128, 512}));
  EXPECT_EQ(uv[2].shape(), (Shape{16, 3, 128}));
  EXPECT_EQ(uv[2].strides(), (Shape{128, 16 * 128, 1}));
  // A model without MLA has no bmm cases.
  const engine::ModelSpec llama = engine::resolve_model("tiny-llama");
  EXPECT_TRUE(bench::cases_for("bmm", test::contract_view(llama), o).empty());
}

TEST(Bmm, CasesPassTheValidationContractOnCpu) {
  test::check_op_contract({"tiny-deepseek-v2", "bmm"}, Device::cpu(), {1, 3, 300}, 1, DType::bf16);
  test::check_op_contract({"tiny-deepseek-v2", "bmm"}, Device::cpu(), {3}, 0, DType::f32);
  test::check_op_contract({"deepseek-v2-lite", "bmm"}, Device::cpu(), {3}, 0, DType::bf16);
}

}  // namespace
