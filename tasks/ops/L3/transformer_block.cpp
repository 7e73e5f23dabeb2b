// transformer_block: TransformerBlock (tasks/baseline/L3/transformer_block.h), gpt-oss's decoder layer, as layer 0
// (a sliding layer).
#include "L3/transformer_block.h"
#include "configs/gpt_oss.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(TransformerBlock)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(TransformerBlock, "L3/transformer_block.h");
KBN_REQUIRE_CTOR(TransformerBlock, "L3/transformer_block.h", const GptOssConfig&, int64_t, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(TransformerBlock, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/transformer_block.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "transformer_block",
         .class_name = "TransformerBlock",
         .level = 3,
         .header = "L3/transformer_block.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "transformer_block", 3,
             [](const OpArgs& a) {
               return std::make_unique<TransformerBlock>(GptOssConfig::from(a.model_config()), 0, "model.layers.0",
                                                         a.opts);
             },
             [](TransformerBlock& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1], t[2]);
               return Tensors{h, res};
             }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe || !m.moe->swigluoai || !m.attention) return {};
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim, E = m.moe->num_experts;
           const int64_t qkv = (at.num_heads + 2 * at.num_kv_heads) * D;
           // Attention (qkv, o, biases, sinks), the router with its bias, two norms.
           const int64_t params = H * qkv + qkv + at.num_heads * D * H + H + at.num_heads + H * E + E + 2 * H;
           std::vector<BenchCase> cs = cases::block_cases(
               "transformer_block", m, o,
               {.params = params, .in_features = H, .out_features = H, .attention = true, .residual = true});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
