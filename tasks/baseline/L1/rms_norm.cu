#include "L1/rms_norm.h"

#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/rms_norm.cuh"
#endif

namespace kbn::KBN_VARIANT {

// ---- op layer ----

RMSNorm::RMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts) : hidden_size_(hidden_size), eps_(eps) {
  KBN_CHECK(hidden_size > 0, "RMSNorm: argument 'hidden_size' must be positive, got ", hidden_size);
  KBN_CHECK(eps > 0, "RMSNorm: argument 'eps' must be positive, got ", eps);
  weight = Tensor::full({hidden_size}, 1.0, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::ones);
}

static void check_rms_input(const Tensor& t, const char* arg, const Tensor& weight, int64_t hidden, bool heads_ok) {
  if (heads_ok)
    KBN_CHECK(t.dim() == 2 || t.dim() == 3, "rms_norm: argument '", arg,
              "' must be [num_tokens, hidden_size] or [num_tokens, heads, hidden_size], got ", t.str());
  else
    check_rank(t, "rms_norm", arg, 2, "[num_tokens, hidden_size]");
  check_size(t, "rms_norm", arg, t.dim() - 1, hidden, "hidden_size");
  check_last_dim_contiguous(t, "rms_norm", arg);
  check_same_dtype(t, weight, "rms_norm", arg, "weight");
  check_same_device(t, weight, "rms_norm", arg, "weight");
}

Tensor RMSNorm::forward(const Tensor& x) {
  check_rms_input(x, "x", weight, hidden_size_, true);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::rms_norm(out, x, weight, eps_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const bool heads = x.dim() == 3;
  KBN_CHECK(!heads || x.size(1) <= std::numeric_limits<int>::max(), "rms_norm: argument 'x' has too many heads, got ",
            x.str());
  RmsNormParams p{out.data_ptr(),    x.data_ptr(), nullptr, weight.data_ptr(), hidden_size_, x.stride(0), 0,
                  int(hidden_size_), float(eps_)};
  if (heads) {
    p.heads = int(x.size(1));
    p.x_head_stride = x.stride(1);
  }
  const int64_t rows = x.numel() / hidden_size_;
  dispatch_float16_32(x.dtype(), "rms_norm", "x",
                      [&](auto t) { launch_rms_norm<decltype(t), false>(p, rows, current_stream()); });
#endif
  return out;
}

std::pair<Tensor, Tensor> RMSNorm::forward(const Tensor& x, const Tensor& residual) {
  check_rms_input(x, "x", weight, hidden_size_, false);
  // An fp32 residual stream with 16-bit activations (Mamba-2's residual_in_fp32) is allowed; else the dtypes match.
  const bool f32_residual = residual.dtype() == DType::f32 && x.dtype() != DType::f32;
  if (f32_residual) {
    check_rank(residual, "fused_add_rms_norm", "residual", 2, "[num_tokens, hidden_size]");
    check_size(residual, "fused_add_rms_norm", "residual", 1, hidden_size_, "hidden_size");
    check_last_dim_contiguous(residual, "fused_add_rms_norm", "residual");
    check_same_device(residual, weight, "fused_add_rms_norm", "residual", "weight");
  } else {
    check_rms_input(residual, "residual", weight, hidden_size_, false);
  }
  KBN_CHECK(x.shape() == residual.shape(), "fused_add_rms_norm: 'x' ", x.str(), " and 'residual' ", residual.str(),
            " differ in shape");
  if (x.is_cpu()) {
    Tensor xm = x, rm = residual;
    reference::fused_add_rms_norm(xm, rm, weight, eps_);
    return {x, residual};
  }
#ifdef KBN_WITH_CUDA
  RmsNormParams p{x.data_ptr(), x.data_ptr(),       residual.data_ptr(), weight.data_ptr(), x.stride(0),
                  x.stride(0),  residual.stride(0), int(hidden_size_),   float(eps_)};  // heads = 1
  if (f32_residual) {
    if (x.dtype() == DType::bf16)
      launch_rms_norm_f32_residual<__nv_bfloat16>(p, x.size(0), current_stream());
    else
      launch_rms_norm_f32_residual<__half>(p, x.size(0), current_stream());
  } else {
    dispatch_float16_32(x.dtype(), "fused_add_rms_norm", "x",
                        [&](auto t) { launch_rms_norm<decltype(t), true>(p, x.size(0), current_stream()); });
  }
#endif
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
