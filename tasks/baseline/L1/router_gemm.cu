#include "L1/router_gemm.h"

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cublaslt_linear.h"
#endif

namespace kbn::KBN_VARIANT {

Tensor RouterGemm::forward(const Tensor& x, const Tensor& weight) {
  constexpr const char* op = "router_gemm";
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  check_rank(weight, op, "weight", 2, "[num_experts, hidden]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_same_dtype(x, weight, op, "x", "weight");
  check_same_device(x, weight, op, "x", "weight");
  check_size(x, op, "x", 1, weight.size(1), "hidden");
  check_last_dim_contiguous(x, op, "x");
  check_contiguous(weight, op, "weight");
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  KBN_CHECK(k > 0, op, ": argument 'weight' must have hidden > 0, got ", weight.str());
  KBN_CHECK(m <= 1 || x.stride(0) >= k, op, ": argument 'x' rows overlap (row stride below hidden), got ", x.str());
  Tensor out = Tensor::empty({m, n}, DType::f32, x.device());
  if (m == 0 || n == 0) return out;
  if (x.is_cpu()) {
    reference::linear(out, x, weight, Tensor());
    return out;
  }
#ifdef KBN_WITH_CUDA
  cublaslt_linear(out.data_ptr(), x.data_ptr(), weight.data_ptr(), nullptr,
                  {.m = m,
                   .n = n,
                   .k = k,
                   .lda = m == 1 ? k : x.stride(0),
                   .dtype = x.dtype(),
                   .out_dtype = DType::f32,
                   .has_bias = false,
                   .op = op},
                  x.device().index, current_stream());
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
