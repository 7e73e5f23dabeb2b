// Oracle: linear layer, out = x @ weight^T + bias (F.linear, vLLM UnquantizedLinearMethod.apply).
#include <vector>

#include "kbn/checks.h"
#include "kbn/parallel.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kOp = "reference::linear";

}  // namespace

void linear(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_rank(x, kOp, "x", 2, "[num_tokens, in_features]");
  check_dtype(x, kOp, "x", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(x, kOp, "x");
  const int64_t num_tokens = x.size(0), in_features = x.size(1);
  check_rank(weight, kOp, "weight", 2, "[out_features, in_features]");
  check_dtype(weight, kOp, "weight", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(weight, kOp, "weight");
  check_size(weight, kOp, "weight", 1, in_features, "in_features = x.size(1)");
  const int64_t out_features = weight.size(0);
  if (bias.defined()) {
    check_rank(bias, kOp, "bias", 1, "[out_features]");
    check_dtype(bias, kOp, "bias", {DType::f32, DType::f16, DType::bf16});
    check_cpu(bias, kOp, "bias");
    check_size(bias, kOp, "bias", 0, out_features, "out_features = weight.size(0)");
  }
  check_rank(out, kOp, "out", 2, "[num_tokens, out_features]");
  check_dtype(out, kOp, "out", {DType::f32, DType::f16, DType::bf16});
  check_cpu(out, kOp, "out");
  check_size(out, kOp, "out", 0, num_tokens, "num_tokens = x.size(0)");
  check_size(out, kOp, "out", 1, out_features, "out_features = weight.size(0)");

  const std::vector<double> xv = x.to_doubles();
  const std::vector<double> b = bias.defined() ? bias.to_doubles() : std::vector<double>(size_t(out_features), 0.0);
  std::vector<float> o(size_t(num_tokens * out_features));
  // Output features are independent: threads take contiguous ranges of them (kbn/parallel.h).
  parallel_for(out_features, grain_for(num_tokens * in_features), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      // NOTE: one weight row at a time, so a vocabulary-sized weight never exists as doubles all at once.
      const std::vector<double> w = weight.select(0, j).to_doubles();
      for (int64_t t = 0; t < num_tokens; ++t) {
        double acc = b[size_t(j)];
        for (int64_t i = 0; i < in_features; ++i) acc += xv[size_t(t * in_features + i)] * w[size_t(i)];
        o[size_t(t * out_features + j)] = float(acc);
      }
    }
  });
  out.copy_(Tensor::from_floats(o, {num_tokens, out_features}, DType::f32));
}

}  // namespace kbn::reference
