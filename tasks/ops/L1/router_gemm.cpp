// router_gemm: class RouterGemm (tasks/baseline/L1/router_gemm.h), a MoE router's GEMM with f32 logits (DeepSeek's
// gates); oracle tasks/reference/linear.cpp into an f32 output.
#include "L1/router_gemm.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(RouterGemm)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(RouterGemm, "L1/router_gemm.h");
KBN_REQUIRE_METHOD(RouterGemm, Tensor, forward, (const Tensor&, const Tensor&), "L1/router_gemm.h");

namespace {

// The gate of a DeepSeek MoE layer: [T, hidden] activations against [num_experts, hidden] gate rows -> f32 logits.
std::vector<BenchCase> router_gemm_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe || !m.moe->grouped_router) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size, E = m.moe->num_experts;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("router_gemm", m, T, dt);
    b.label = "T=" + cases::str(T) + " E=" + cases::str(E) + " H=" + cases::str(H);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, H}, dt, d, seed, "x", 1.0),
                                 cases::normal({E, H}, dt, d, seed, "weight", cases::kWeightStd)};
    };
    b.bytes = (T * H + E * H) * es + T * E * 4;
    b.flops = 2 * T * E * H;
    b.input_bytes = (T * H + E * H) * es;
    b.output_numel = T * E;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "router_gemm",
         .class_name = "RouterGemm",
         .level = 1,
         .header = "L1/router_gemm.h",
         .ctor_args = {},
         .args = {"x", "weight"},
         .mutates = {},
         .make = adapter(
             "router_gemm", 2, [](const OpArgs&) { return std::make_unique<RouterGemm>(); },
             [](RouterGemm& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         // NOTE: cuBLASLt's kernels are declared by linear, as for bmm: a kernel trace counts the gate's GEMM as
         // linear's (declaring the same names here would make every cuBLAS kernel "linear / router_gemm (shared
         // kernel)").
         .kernels = {},
         .cases = router_gemm_cases,
         // The logits are f32 whatever the operands' dtype: f32 accumulation against the oracle's double sums.
         .tolerance = [](DType) { return dtype_tolerance(DType::f32); }});
}

}  // namespace kbn::KBN_VARIANT
