#include "L1/gemma_rms_norm.h"

#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/rms_norm.cuh"  // the rms_norm kernels, with the scale 1 + weight (weight_offset 1)
#endif

namespace kbn::KBN_VARIANT {

// ---- op layer ----

GemmaRMSNorm::GemmaRMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts)
    : hidden_size_(hidden_size), eps_(eps) {
  KBN_CHECK(hidden_size > 0, "GemmaRMSNorm: argument 'hidden_size' must be positive, got ", hidden_size);
  KBN_CHECK(hidden_size <= std::numeric_limits<int>::max(), "GemmaRMSNorm: argument 'hidden_size' is too large, got ",
            hidden_size);
  KBN_CHECK(eps > 0, "GemmaRMSNorm: argument 'eps' must be positive, got ", eps);
  weight = Tensor::zeros({hidden_size}, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::zeros);
}

static void check_gemma_input(const Tensor& t, const char* op, const char* arg, const Tensor& weight, int64_t hidden,
                              bool heads_ok) {
  if (heads_ok)
    KBN_CHECK(t.dim() == 2 || t.dim() == 3, op, ": argument '", arg,
              "' must be [num_tokens, hidden_size] or [num_tokens, heads, hidden_size], got ", t.str());
  else
    check_rank(t, op, arg, 2, "[num_tokens, hidden_size]");
  check_dtype(t, op, arg, {DType::f32, DType::f16, DType::bf16});
  check_size(t, op, arg, t.dim() - 1, hidden, "hidden_size");
  check_last_dim_contiguous(t, op, arg);
  check_same_dtype(t, weight, op, arg, "weight");
  check_same_device(t, weight, op, arg, "weight");
}

Tensor GemmaRMSNorm::forward(const Tensor& x) {
  constexpr const char* op = "gemma_rms_norm";
  check_gemma_input(x, op, "x", weight, hidden_size_, true);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.is_cpu()) {
    reference::gemma_rms_norm(out, x, weight, eps_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  const bool heads = x.dim() == 3;
  KBN_CHECK(!heads || x.size(1) <= std::numeric_limits<int>::max(), op, ": argument 'x' has too many heads, got ",
            x.str());
  RmsNormParams p{.out = out.data_ptr(),
                  .x = x.data_ptr(),
                  .residual = nullptr,
                  .weight = weight.data_ptr(),
                  .out_stride = hidden_size_,
                  .x_stride = x.stride(0),
                  .residual_stride = 0,
                  .hidden = int(hidden_size_),
                  .eps = float(eps_),
                  .weight_offset = 1.f};
  if (heads) {
    p.heads = int(x.size(1));
    p.x_head_stride = x.stride(1);
  }
  const int64_t rows = x.numel() / hidden_size_;
  dispatch_float16_32(x.dtype(), op, "x",
                      [&](auto t) { launch_rms_norm<decltype(t), false>(p, rows, current_stream()); });
#endif
  return out;
}

std::pair<Tensor, Tensor> GemmaRMSNorm::forward(const Tensor& x, const Tensor& residual) {
  constexpr const char* op = "gemma_fused_add_rms_norm";
  check_gemma_input(x, op, "x", weight, hidden_size_, false);
  check_gemma_input(residual, op, "residual", weight, hidden_size_, false);
  KBN_CHECK(x.shape() == residual.shape(), op, ": 'x' ", x.str(), " and 'residual' ", residual.str(),
            " differ in shape");
  if (x.is_cpu()) {
    Tensor xm = x, rm = residual;
    reference::gemma_fused_add_rms_norm(xm, rm, weight, eps_);
    return {x, residual};
  }
#ifdef KBN_WITH_CUDA
  const RmsNormParams p{.out = x.data_ptr(),
                        .x = x.data_ptr(),
                        .residual = residual.data_ptr(),
                        .weight = weight.data_ptr(),
                        .out_stride = x.stride(0),
                        .x_stride = x.stride(0),
                        .residual_stride = residual.stride(0),
                        .hidden = int(hidden_size_),
                        .eps = float(eps_),
                        .weight_offset = 1.f};  // heads = 1
  dispatch_float16_32(x.dtype(), op, "x",
                      [&](auto t) { launch_rms_norm<decltype(t), true>(p, x.size(0), current_stream()); });
#endif
  return {x, residual};
}

}  // namespace kbn::KBN_VARIANT
