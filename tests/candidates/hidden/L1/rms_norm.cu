// Test candidate, not a kernel: a CPU-only RMSNorm (the reference oracle), to be hidden by the candidate
// L3/llama_decoder_layer.h of this folder, which no longer includes L1/rms_norm.h.
#include "L1/rms_norm.h"

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::KBN_VARIANT {

RMSNorm::RMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts) : hidden_size_(hidden_size), eps_(eps) {
  weight = Tensor::full({hidden_size}, 1.0, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::ones);
}

Tensor RMSNorm::forward(const Tensor& x) {
  KBN_CHECK(x.is_cpu(), "hidden test candidate: CPU only");
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  reference::rms_norm(out, x, weight, eps_);
  return out;
}

std::pair<Tensor, Tensor> RMSNorm::forward(const Tensor& x, const Tensor& residual) {
  KBN_CHECK(x.is_cpu(), "hidden test candidate: CPU only");
  Tensor xm = x, rm = residual;
  reference::fused_add_rms_norm(xm, rm, weight, eps_);
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
