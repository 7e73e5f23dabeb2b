// mlp_block: MLPBlock (tasks/baseline/L2/mlp_block.h) of layer 0: router GEMM with bias (H -> E), top-k softmax with
// renormalized weights, grouped swigluoai expert GEMMs with biases (gpt-oss).
#include "L2/mlp_block.h"
#include "configs/gpt_oss.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MLPBlock)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MLPBlock, "L2/mlp_block.h");
KBN_REQUIRE_CTOR(MLPBlock, "L2/mlp_block.h", const GptOssConfig&, const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(MLPBlock, Tensor, forward, (const Tensor&), "L2/mlp_block.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mlp_block",
         .class_name = "MLPBlock",
         .level = 2,
         .header = "L2/mlp_block.h",
         .ctor_args = {},
         .args = {"hidden_states"},
         .mutates = {},
         .make = adapter(
             "mlp_block", 1,
             [](const OpArgs& a) {
               return std::make_unique<MLPBlock>(GptOssConfig::from(a.model_config()), "model.layers.0.mlp", a.opts);
             },
             [](MLPBlock& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe || !m.moe->swigluoai) return {};
           const int64_t H = m.hidden_size, E = m.moe->num_experts;
           std::vector<BenchCase> cs =
               cases::block_cases("mlp_block", m, o, {.params = H * E + E, .in_features = H, .out_features = H});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
