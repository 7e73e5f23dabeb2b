// Test candidate, not a kernel: an RMSNorm whose output is halved, so a build with this candidate must show
// different L4 outputs in the candidate variant and unchanged ones in the baseline variant.
#include "L1/rms_norm.h"

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::KBN_VARIANT {

RMSNorm::RMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts) : hidden_size_(hidden_size), eps_(eps) {
  weight = Tensor::full({hidden_size}, 1.0, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::ones);
}

static Tensor halve(const Tensor& t) {
  std::vector<float> v = t.to_floats();
  for (float& x : v) x *= 0.5f;
  return Tensor::from_floats(v, t.shape(), t.dtype());
}

Tensor RMSNorm::forward(const Tensor& x) {
  KBN_CHECK(x.is_cpu(), "scaled_rms_norm test candidate: CPU only");
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  reference::rms_norm(out, x, weight, eps_);
  return halve(out);
}

std::pair<Tensor, Tensor> RMSNorm::forward(const Tensor& x, const Tensor& residual) {
  KBN_CHECK(x.is_cpu(), "scaled_rms_norm test candidate: CPU only");
  Tensor xm = x, rm = residual;
  reference::fused_add_rms_norm(xm, rm, weight, eps_);
  xm.copy_(halve(xm));
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
