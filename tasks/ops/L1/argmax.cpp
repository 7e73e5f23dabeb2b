// argmax: class Argmax (tasks/baseline/L1/argmax.h), the greedy sampler; oracle tasks/reference/sampling.cpp.
#include "L1/argmax.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Argmax)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Argmax, "L1/argmax.h");
KBN_REQUIRE_METHOD(Argmax, Tensor, forward, (const Tensor&), "L1/argmax.h");

namespace {

std::vector<BenchCase> argmax_cases(const ModelView& m, const CaseOptions& o) {
  // NOTE: the sampler sees the full vocabulary (logits are gathered across ranks), so V is not split.
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), V = m.total_vocab_size;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("argmax", m, T, dt);
    b.label = "T=" + cases::str(T) + " V=" + cases::str(V);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, V}, dt, d, seed, "logits", 1.0)};
    };
    b.bytes = T * V * es + T * 8;  // logits read, i64 indices written
    b.flops = T * V;               // one comparison per logit
    b.input_bytes = T * V * es;
    b.output_numel = T;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "argmax",
         .class_name = "Argmax",
         .level = 1,
         .header = "L1/argmax.h",
         .ctor_args = {},
         .args = {"logits"},
         .mutates = {},
         .make = adapter(
             "argmax", 1, [](const OpArgs&) { return std::make_unique<Argmax>(); },
             [](Argmax& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"argmax"},
         .cases = argmax_cases,
         .every_model = true,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
