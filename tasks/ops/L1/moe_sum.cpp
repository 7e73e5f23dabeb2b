// moe_sum: class MoeSum (tasks/baseline/L1/moe_sum.h), each token's top_k expert outputs summed; oracle
// tasks/reference/moe.cpp.
#include "L1/moe_sum.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MoeSum)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MoeSum, "L1/moe_sum.h");
KBN_REQUIRE_CTOR(MoeSum, "L1/moe_sum.h");
KBN_REQUIRE_METHOD(MoeSum, Tensor, forward, (const Tensor&), "L1/moe_sum.h");

namespace {

std::vector<BenchCase> moe_sum_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size, k = m.moe->top_k;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("moe_sum", m, T, dt);
    b.label = "T=" + cases::str(T) + " k=" + cases::str(k) + " H=" + cases::str(H);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, k, H}, dt, d, seed, "input", 1.0)};
    };
    b.bytes = (k + 1) * T * H * es;  // [T, k, H] read, [T, H] written
    b.flops = (k - 1) * T * H;
    b.input_bytes = k * T * H * es;
    b.output_numel = T * H;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "moe_sum",
         .class_name = "MoeSum",
         .level = 1,
         .header = "L1/moe_sum.h",
         .ctor_args = {},
         .args = {"input"},
         .mutates = {},
         .make = adapter(
             "moe_sum", 1, [](const OpArgs&) { return std::make_unique<MoeSum>(); },
             [](MoeSum& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"moe_sum"},
         .cases = moe_sum_cases});
}

}  // namespace kbn::KBN_VARIANT
