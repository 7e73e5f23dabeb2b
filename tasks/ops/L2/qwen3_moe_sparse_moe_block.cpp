// qwen3_moe_sparse_moe_block: Qwen3MoeSparseMoeBlock (tasks/baseline/L2/qwen3_moe_sparse_moe_block.h) of the first
// sparse layer: router GEMM, top-k softmax (renormalized per norm_topk_prob), grouped expert GEMMs. Cases for
// Qwen3-MoE configs (those naming moe_intermediate_size and num_experts).
#include "L2/qwen3_moe_sparse_moe_block.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Qwen3MoeSparseMoeBlock)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Qwen3MoeSparseMoeBlock, "L2/qwen3_moe_sparse_moe_block.h");
KBN_REQUIRE_CTOR(Qwen3MoeSparseMoeBlock, "L2/qwen3_moe_sparse_moe_block.h", const Qwen3MoeConfig&,
                 const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(Qwen3MoeSparseMoeBlock, Tensor, forward, (const Tensor&), "L2/qwen3_moe_sparse_moe_block.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "qwen3_moe_sparse_moe_block",
         .class_name = "Qwen3MoeSparseMoeBlock",
         .level = 2,
         .header = "L2/qwen3_moe_sparse_moe_block.h",
         .ctor_args = {},
         .args = {"hidden_states"},
         .mutates = {},
         .make = adapter(
             "qwen3_moe_sparse_moe_block", 1,
             [](const OpArgs& a) {
               const Qwen3MoeConfig c = Qwen3MoeConfig::from(a.model_config());
               KBN_CHECK(c.num_experts > 0, "qwen3_moe_sparse_moe_block: model config ", a.model_config().source(),
                         " has no experts");
               return std::make_unique<Qwen3MoeSparseMoeBlock>(c, "model.layers.0.mlp", a.opts);
             },
             [](Qwen3MoeSparseMoeBlock& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe || !m.config->has("moe_intermediate_size") || !m.config->has("num_experts")) return {};
           const int64_t H = m.hidden_size;
           std::vector<BenchCase> cs = cases::block_cases("qwen3_moe_sparse_moe_block", m, o,
                                                          {.params = H * m.moe->num_experts, .in_features = H,
                                                           .out_features = H});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
