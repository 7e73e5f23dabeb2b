// Oracle: the gated activations of the MLPs, each [num_tokens, 2d] -> [num_tokens, d]: silu_and_mul (vLLM SiluAndMul,
// Llama), gelu_and_mul (vLLM GeluAndMul, Gemma-3), swiglu_oai_and_mul (vLLM SwigluOAIAndMul, gpt-oss's experts).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

double silu(double a) { return a / (1.0 + std::exp(-a)); }

// Checks x [num_tokens, 2 * d] and out [num_tokens, d]; returns d.
int64_t check_gated(const Tensor& out, const Tensor& x, const char* op) {
  check_rank(x, op, "x", 2, "[num_tokens, 2 * d]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(x, op, "x");
  KBN_CHECK(x.size(1) % 2 == 0, op, ": argument 'x' [num_tokens, 2 * d] must have an even last dimension, got ",
            x.str());
  const int64_t n = x.size(0), d = x.size(1) / 2;
  check_rank(out, op, "out", 2, "[num_tokens, d]");
  check_dtype(out, op, "out", {DType::f32, DType::f16, DType::bf16});
  check_cpu(out, op, "out");
  check_size(out, op, "out", 0, n, "num_tokens");
  check_size(out, op, "out", 1, d, "d = x.size(1) / 2");
  return d;
}

// out[t, i] = f(x[t, gate(i)], x[t, up(i)]) in double, rounded once.
template <class F>
void gated(Tensor& out, const Tensor& x, int64_t d, bool interleaved, F f) {
  const int64_t n = x.size(0);
  const std::vector<double> xv = x.to_doubles();
  std::vector<float> o(size_t(n * d));
  for (int64_t t = 0; t < n; ++t) {
    const double* row = &xv[size_t(t * 2 * d)];
    for (int64_t i = 0; i < d; ++i) {
      const double gate = interleaved ? row[2 * i] : row[i], up = interleaved ? row[2 * i + 1] : row[d + i];
      o[size_t(t * d + i)] = float(f(gate, up));
    }
  }
  out.copy_(Tensor::from_floats(o, {n, d}, DType::f32));
}

}  // namespace

void silu_and_mul(Tensor& out, const Tensor& x) {
  const int64_t d = check_gated(out, x, "reference::silu_and_mul");
  gated(out, x, d, false, [](double gate, double up) { return silu(gate) * up; });
}

void gelu_and_mul(Tensor& out, const Tensor& x, const std::string& approximate) {
  constexpr const char* op = "reference::gelu_and_mul";
  KBN_CHECK(approximate == "none" || approximate == "tanh", op,
            ": argument 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\"");
  const int64_t d = check_gated(out, x, op);
  if (approximate == "none") {
    gated(out, x, d, false,
          [](double a, double up) { return 0.5 * a * (1.0 + std::erf(a / std::numbers::sqrt2)) * up; });
  } else {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    gated(out, x, d, false,
          [k](double a, double up) { return 0.5 * a * (1.0 + std::tanh(k * (a + 0.044715 * a * a * a))) * up; });
  }
}

void swiglu_oai_and_mul(Tensor& out, const Tensor& x, double alpha, double limit) {
  constexpr const char* op = "reference::swiglu_oai_and_mul";
  KBN_CHECK(std::isfinite(alpha), op, ": argument 'alpha' must be finite, got ", alpha);
  KBN_CHECK(limit > 0, op, ": argument 'limit' must be positive, got ", limit);
  const int64_t d = check_gated(out, x, op);
  gated(out, x, d, true, [alpha, limit](double gate, double up) {
    const double g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
    return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
  });
}

}  // namespace kbn::reference
