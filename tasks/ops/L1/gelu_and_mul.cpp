// gelu_and_mul: class GeluAndMul (tasks/baseline/L1/gelu_and_mul.h), oracle tasks/reference/activation.cpp.
#include "L1/gelu_and_mul.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(GeluAndMul)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(GeluAndMul, "L1/gelu_and_mul.h");
KBN_REQUIRE_CTOR(GeluAndMul, "L1/gelu_and_mul.h", const std::string&);
KBN_REQUIRE_METHOD(GeluAndMul, Tensor, forward, (const Tensor&), "L1/gelu_and_mul.h");

namespace {

// The config's gelu: "gelu" is the exact one; Gemma-3's "gelu_pytorch_tanh" (and any other spelling) the tanh form.
bool config_gelu_is_tanh(const ModelView& m) {
  if (!m.config) return true;
  const std::string act = m.config->get_string("hidden_activation", m.config->get_string("hidden_act", ""));
  return act != "gelu";
}

// The dense MLP's activation (Gemma-3's Gemma3MLP): [T, 2I] -> [T, I] with I this rank's intermediate size.
std::vector<BenchCase> gelu_and_mul_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.intermediate_size) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), I = *m.intermediate_size;
  const bool tanh = config_gelu_is_tanh(m);
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("gelu_and_mul", m, T, dt);
    b.label = "T=" + cases::str(T) + " I=" + cases::str(I) + (tanh ? " tanh" : " none");
    b.args.values = {{"approximate_tanh", tanh ? 1.0 : 0.0}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, 2 * I}, dt, d, seed, "x", 1.0)};
    };
    b.bytes = 3 * T * I * es;  // x [T, 2I] read, out [T, I] written
    b.flops = 9 * T * I;       // gelu (cube, fma, tanh or erf, add, two multiplies) and the product
    b.input_bytes = 2 * T * I * es;
    b.output_numel = T * I;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "gelu_and_mul",
         .class_name = "GeluAndMul",
         .level = 1,
         .header = "L1/gelu_and_mul.h",
         .ctor_args = {"approximate_tanh"},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "gelu_and_mul", 1,
             [](const OpArgs& a) {
               return std::make_unique<GeluAndMul>(a.get("approximate_tanh", 1.0) != 0.0 ? "tanh" : "none");
             },
             [](GeluAndMul& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"gelu_and_mul"},
         .cases = gelu_and_mul_cases});
}

}  // namespace kbn::KBN_VARIANT
