// gemma3_mlp: Gemma3MLP (tasks/baseline/L2/gemma3_mlp.h) of layer 0, gate_up GEMM -> gelu_and_mul (tanh) -> down GEMM.
#include "L2/gemma3_mlp.h"
#include "configs/gemma3.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Gemma3MLP)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Gemma3MLP, "L2/gemma3_mlp.h");
KBN_REQUIRE_CTOR(Gemma3MLP, "L2/gemma3_mlp.h", int64_t, int64_t, const std::string&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(Gemma3MLP, Tensor, forward, (const Tensor&), "L2/gemma3_mlp.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gemma3_mlp",
         .class_name = "Gemma3MLP",
         .level = 2,
         .header = "L2/gemma3_mlp.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "gemma3_mlp", 1,
             [](const OpArgs& a) {
               const Gemma3TextConfig c = Gemma3TextConfig::from(a.model_config());
               return std::make_unique<Gemma3MLP>(c.hidden_size, c.intermediate_size, "gelu_pytorch_tanh",
                                                  "model.layers.0.mlp", a.opts);
             },
             [](Gemma3MLP& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.intermediate_size) return {};
           const int64_t H = m.hidden_size, I = *m.intermediate_size;
           return cases::block_cases("gemma3_mlp", m, o, {.params = 3 * H * I, .in_features = H, .out_features = H});
         }});
}

}  // namespace kbn::KBN_VARIANT
