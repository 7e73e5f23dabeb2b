// Oracle: silu_and_mul (vLLM SiluAndMul, the gated activation of the Llama MLP).
#include <cmath>
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kOp = "reference::silu_and_mul";

double silu(double a) { return a / (1.0 + std::exp(-a)); }

}  // namespace

void silu_and_mul(Tensor& out, const Tensor& x) {
  check_rank(x, kOp, "x", 2, "[num_tokens, 2 * d]");
  check_dtype(x, kOp, "x", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(x, kOp, "x");
  KBN_CHECK(x.size(1) % 2 == 0, kOp, ": argument 'x' [num_tokens, 2 * d] must have an even last dimension, got ",
            x.str());
  const int64_t n = x.size(0), d = x.size(1) / 2;
  check_rank(out, kOp, "out", 2, "[num_tokens, d]");
  check_dtype(out, kOp, "out", {DType::f32, DType::f16, DType::bf16});
  check_cpu(out, kOp, "out");
  check_size(out, kOp, "out", 0, n, "num_tokens");
  check_size(out, kOp, "out", 1, d, "d = x.size(1) / 2");

  const std::vector<double> xv = x.to_doubles();
  std::vector<float> o(size_t(n * d));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      const double gate = xv[size_t(t * 2 * d + i)], up = xv[size_t(t * 2 * d + d + i)];
      o[size_t(t * d + i)] = float(silu(gate) * up);
    }
  }
  out.copy_(Tensor::from_floats(o, {n, d}, DType::f32));
}

}  // namespace kbn::reference
