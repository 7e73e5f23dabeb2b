// replicated_linear: ReplicatedLinear (tasks/baseline/L2/replicated_linear.h) as layer 0's MoE router
// (hidden_size -> num_experts, no bias); cases for models with experts (ModelView::moe).
#include "L2/replicated_linear.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(ReplicatedLinear)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(ReplicatedLinear, "L2/replicated_linear.h");
KBN_REQUIRE_CTOR(ReplicatedLinear, "L2/replicated_linear.h", int64_t, int64_t, bool, bool, const ParamOptions&,
                 const std::string&);
KBN_REQUIRE_METHOD(ReplicatedLinear, TensorPair, forward, (const Tensor&), "L2/replicated_linear.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "replicated_linear",
         .class_name = "ReplicatedLinear",
         .level = 2,
         .header = "L2/replicated_linear.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "replicated_linear", 1,
             [](const OpArgs& a) {
               const ModelView m = view_of(a);
               KBN_CHECK(m.moe, "replicated_linear: model config ", a.model_config().source(),
                         " has no experts (its cases are the MoE router)");
               return std::make_unique<ReplicatedLinear>(m.hidden_size, m.moe->num_experts, false, false, a.opts,
                                                         "model.layers.0.mlp.gate");
             },
             [](ReplicatedLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe) return {};
           const int64_t E = m.moe->num_experts;
           return cases::block_cases("replicated_linear", m, o,
                                     {.params = m.hidden_size * E, .in_features = m.hidden_size, .out_features = E});
         }});
}

}  // namespace kbn::KBN_VARIANT
