// Oracle: rms_norm and fused_add_rms_norm.
#include <cmath>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

static void check_norm_args(const Tensor& x, const Tensor& weight, const char* op) {
  KBN_CHECK(x.dim() == 2 || x.dim() == 3, op, ": argument 'x' must be [num_tokens, hidden_size] or [num_tokens, heads, ",
            "hidden_size], got ", x.str());
  check_rank(weight, op, "weight", 1, "[hidden_size]");
  check_size(x, op, "x", x.dim() - 1, weight.size(0), "hidden_size");
  check_cpu(x, op, "x");
  check_cpu(weight, op, "weight");
}

void rms_norm(Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  check_norm_args(x, weight, "reference::rms_norm");
  KBN_CHECK(out.shape() == x.shape(), "reference::rms_norm: 'out' ", out.str(), " must match 'x' ", x.str());
  const int64_t h = x.size(x.dim() - 1), n = x.numel() / h;
  std::vector<double> xv = x.to_doubles(), w = weight.to_doubles(), o(size_t(n * h));
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += xv[size_t(t * h + i)] * xv[size_t(t * h + i)];
    double inv = 1.0 / std::sqrt(ss / double(h) + eps);
    for (int64_t i = 0; i < h; ++i) o[size_t(t * h + i)] = xv[size_t(t * h + i)] * inv * w[size_t(i)];
  }
  out.copy_(Tensor::from_floats(std::vector<float>(o.begin(), o.end()), x.shape(), DType::f32));
}

void fused_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, double eps) {
  check_norm_args(x, weight, "reference::fused_add_rms_norm");
  KBN_CHECK(residual.shape() == x.shape(), "reference::fused_add_rms_norm: 'residual' ", residual.str(),
            " must match 'x' ", x.str());
  std::vector<double> xv = x.to_doubles(), rv = residual.to_doubles();
  // The new residual is the sum rounded to the residual's dtype, and the norm reads that rounded residual
  // (vLLM's fused_add_rms_norm and HF's decoder layer both do).
  Tensor sum = Tensor::empty(x.shape(), DType::f32);
  for (size_t i = 0; i < xv.size(); ++i) sum.data<float>()[i] = float(xv[i] + rv[i]);
  residual.copy_(sum);
  rms_norm(x, residual, weight, eps);
}

}  // namespace kbn::reference
