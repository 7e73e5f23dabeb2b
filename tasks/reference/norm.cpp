// Oracle: rms_norm and fused_add_rms_norm (vLLM RMSNorm), gemma_rms_norm and gemma_fused_add_rms_norm (vLLM
// GemmaRMSNorm: the weight enters as 1 + w).
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

namespace {

// out = x / rms(x) * (weight + weight_offset): weight_offset 0 for RMSNorm, 1 for GemmaRMSNorm.
void rms_norm_with_offset(Tensor& out, const Tensor& x, const Tensor& weight, double eps, double weight_offset,
                          const char* op) {
  check_norm_args(x, weight, op);
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  const int64_t h = x.size(x.dim() - 1), n = x.numel() / h;
  std::vector<double> xv = x.to_doubles(), w = weight.to_doubles(), o(size_t(n * h));
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += xv[size_t(t * h + i)] * xv[size_t(t * h + i)];
    double inv = 1.0 / std::sqrt(ss / double(h) + eps);
    for (int64_t i = 0; i < h; ++i)
      o[size_t(t * h + i)] = xv[size_t(t * h + i)] * inv * (w[size_t(i)] + weight_offset);
  }
  out.copy_(Tensor::from_floats(std::vector<float>(o.begin(), o.end()), x.shape(), DType::f32));
}

void fused_add_with_offset(Tensor& x, Tensor& residual, const Tensor& weight, double eps, double weight_offset,
                           const char* op) {
  check_norm_args(x, weight, op);
  KBN_CHECK(residual.shape() == x.shape(), op, ": 'residual' ", residual.str(), " must match 'x' ", x.str());
  std::vector<double> xv = x.to_doubles(), rv = residual.to_doubles();
  // The new residual is the sum rounded to the residual's dtype, and the norm reads that rounded residual
  // (vLLM's fused_add_rms_norm and HF's decoder layer both do).
  Tensor sum = Tensor::empty(x.shape(), DType::f32);
  for (size_t i = 0; i < xv.size(); ++i) sum.data<float>()[i] = float(xv[i] + rv[i]);
  residual.copy_(sum);
  rms_norm_with_offset(x, residual, weight, eps, weight_offset, op);
}

}  // namespace

void rms_norm(Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  rms_norm_with_offset(out, x, weight, eps, 0.0, "reference::rms_norm");
}

void fused_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, double eps) {
  fused_add_with_offset(x, residual, weight, eps, 0.0, "reference::fused_add_rms_norm");
}

void gemma_rms_norm(Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  rms_norm_with_offset(out, x, weight, eps, 1.0, "reference::gemma_rms_norm");
}

void gemma_fused_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, double eps) {
  fused_add_with_offset(x, residual, weight, eps, 1.0, "reference::gemma_fused_add_rms_norm");
}

}  // namespace kbn::reference
