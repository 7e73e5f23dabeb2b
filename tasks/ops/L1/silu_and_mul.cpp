// silu_and_mul: class SiluAndMul (tasks/baseline/L1/silu_and_mul.h), oracle tasks/reference/activation.cpp.
#include "L1/silu_and_mul.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(SiluAndMul)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(SiluAndMul, "L1/silu_and_mul.h");
KBN_REQUIRE_CTOR(SiluAndMul, "L1/silu_and_mul.h");
KBN_REQUIRE_METHOD(SiluAndMul, Tensor, forward, (const Tensor&), "L1/silu_and_mul.h");

namespace {

// The dense MLP's activation: [T, 2I] -> [T, I] with I this rank's intermediate size.
std::vector<BenchCase> silu_and_mul_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.intermediate_size) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), I = *m.intermediate_size;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("silu_and_mul", m, T, dt);
    b.label = "T=" + cases::str(T) + " I=" + cases::str(I);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, 2 * I}, dt, d, seed, "x", 1.0)};
    };
    b.bytes = 3 * T * I * es;  // x [T, 2I] read, out [T, I] written
    b.flops = 5 * T * I;       // silu (exp, add, divide, multiply) and the product
    b.input_bytes = 2 * T * I * es;
    b.output_numel = T * I;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "silu_and_mul",
         .class_name = "SiluAndMul",
         .level = 1,
         .header = "L1/silu_and_mul.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "silu_and_mul", 1, [](const OpArgs&) { return std::make_unique<SiluAndMul>(); },
             [](SiluAndMul& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"silu_and_mul"},
         .cases = silu_and_mul_cases});
}

}  // namespace kbn::KBN_VARIANT
