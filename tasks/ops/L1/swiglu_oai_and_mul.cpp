// swiglu_oai_and_mul: class SwigluOAIAndMul (tasks/baseline/L1/swiglu_oai_and_mul.h), oracle
// tasks/reference/activation.cpp.
#include "L1/swiglu_oai_and_mul.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(SwigluOAIAndMul)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(SwigluOAIAndMul, "L1/swiglu_oai_and_mul.h");
KBN_REQUIRE_CTOR(SwigluOAIAndMul, "L1/swiglu_oai_and_mul.h", double, double);
KBN_REQUIRE_METHOD(SwigluOAIAndMul, Tensor, forward, (const Tensor&), "L1/swiglu_oai_and_mul.h");

namespace {

// The experts' activation (gpt-oss's FusedMoE with activation "swigluoai"): every (token, chosen expert) row of the
// first GEMM's output, [T * top_k, 2N] interleaved gate/up -> [T * top_k, N], N one expert's intermediate size on
// this rank. alpha and limit from the config (swiglu_alpha, swiglu_limit; vLLM's defaults 1.702 and 7.0).
std::vector<BenchCase> swiglu_oai_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), N = m.moe->intermediate_size, K = m.moe->top_k;
  const double alpha = m.config ? m.config->get_double("swiglu_alpha", 1.702) : 1.702;
  const double limit = m.config ? m.config->get_double("swiglu_limit", 7.0) : 7.0;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    const int64_t rows = T * K;
    BenchCase b = cases::base("swiglu_oai_and_mul", m, T, dt);
    b.label = "T=" + cases::str(T) + " top_k=" + cases::str(K) + " N=" + cases::str(N);
    b.args.values = {{"alpha", alpha}, {"limit", limit}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      // std 4: a share of the gates and ups lies beyond the limit of 7, so the clamps are exercised.
      return std::vector<Tensor>{cases::normal({rows, 2 * N}, dt, d, seed, "x", 4.0)};
    };
    b.bytes = 3 * rows * N * es;  // x [rows, 2N] read, out [rows, N] written
    b.flops = 8 * rows * N;       // two clamps, the sigmoid (multiply, exp, add, divide), add one, two multiplies
    b.input_bytes = 2 * rows * N * es;
    b.output_numel = rows * N;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "swiglu_oai_and_mul",
         .class_name = "SwigluOAIAndMul",
         .level = 1,
         .header = "L1/swiglu_oai_and_mul.h",
         .ctor_args = {"alpha", "limit"},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "swiglu_oai_and_mul", 1,
             [](const OpArgs& a) {
               return std::make_unique<SwigluOAIAndMul>(a.get("alpha", 1.702), a.get("limit", 7.0));
             },
             [](SwigluOAIAndMul& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"swiglu_oai_and_mul"},
         .cases = swiglu_oai_cases});
}

}  // namespace kbn::KBN_VARIANT
