// mixtral_moe: MixtralMoE (tasks/baseline/L2/mixtral_moe.h) of layer 0: router GEMM (ReplicatedLinear H -> E), top-k
// softmax with renormalized weights, grouped expert GEMMs. Built from any model's MoE shape (ModelView::moe).
#include "L2/mixtral_moe.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MixtralMoE)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MixtralMoE, "L2/mixtral_moe.h");
KBN_REQUIRE_CTOR(MixtralMoE, "L2/mixtral_moe.h", int64_t, int64_t, int64_t, int64_t, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(MixtralMoE, Tensor, forward, (const Tensor&), "L2/mixtral_moe.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mixtral_moe",
         .class_name = "MixtralMoE",
         .level = 2,
         .header = "L2/mixtral_moe.h",
         .ctor_args = {},
         .args = {"hidden_states"},
         .mutates = {},
         .make = adapter(
             "mixtral_moe", 1,
             [](const OpArgs& a) {
               const ModelView m = view_of(a);
               KBN_CHECK(m.moe, "mixtral_moe: model config ", a.model_config().source(), " has no experts");
               return std::make_unique<MixtralMoE>(m.moe->num_experts, m.moe->top_k, m.hidden_size,
                                                   m.moe->total_intermediate_size, "model.layers.0.block_sparse_moe",
                                                   a.opts);
             },
             [](MixtralMoE& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe) return {};
           const int64_t H = m.hidden_size;
           std::vector<BenchCase> cs = cases::block_cases(
               "mixtral_moe", m, o, {.params = H * m.moe->num_experts, .in_features = H, .out_features = H});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
