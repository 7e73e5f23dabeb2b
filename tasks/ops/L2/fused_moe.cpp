// fused_moe: FusedMoE (tasks/baseline/L2/fused_moe.h), the experts of layer 0's MoE block: top-k softmax routing of
// the given router logits and the grouped expert GEMMs (L1 topk_softmax + fused_experts). Built for any model with
// a MoE (ModelView::moe); renormalize as the config says (Mixtral always, Qwen3-MoE per norm_topk_prob); gpt-oss's
// swigluoai experts with biases where the view says so.
#include "L2/fused_moe.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(FusedMoE)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FusedMoE, "L2/fused_moe.h");
KBN_REQUIRE_CTOR(FusedMoE, "L2/fused_moe.h", int64_t, int64_t, int64_t, int64_t, bool, bool, const std::string&,
                 const ParamOptions&, const ExpertOptions&);
KBN_REQUIRE_METHOD(FusedMoE, Tensor, forward, (const Tensor&, const Tensor&), "L2/fused_moe.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "fused_moe",
         .class_name = "FusedMoE",
         .level = 2,
         .header = "L2/fused_moe.h",
         .ctor_args = {},
         .args = {"hidden_states", "router_logits"},
         .mutates = {},
         .make = adapter(
             "fused_moe", 2,
             [](const OpArgs& a) {
               const ModelView m = view_of(a);
               KBN_CHECK(m.moe, "fused_moe: model config ", a.model_config().source(), " has no experts");
               const ExpertOptions experts{.activation = m.moe->swigluoai ? FusedExperts::Activation::swigluoai
                                                                          : FusedExperts::Activation::silu,
                                           .swiglu_alpha = m.moe->swiglu_alpha,
                                           .swiglu_limit = m.moe->swiglu_limit,
                                           .has_bias = m.moe->expert_bias};
               return std::make_unique<FusedMoE>(m.moe->num_experts, m.moe->top_k, m.hidden_size,
                                                 m.moe->total_intermediate_size, true, m.moe->renormalize,
                                                 "model.layers.0.mlp.experts", a.opts, experts);
             },
             [](FusedMoE& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe) return {};
           // FusedMoE routes by softmax top-k: a DeepSeek router only when it reduces to that (V2-Lite's greedy one
           // group, softmax, no bias, scale 1), not V3's grouped sigmoid router.
           const MoeShape& r = *m.moe;
           if (r.grouped_router && (r.num_expert_group > 1 || r.sigmoid_scores || r.score_correction_bias ||
                                    r.routed_scaling_factor != 1.0))
             return {};
           const int64_t H = m.hidden_size, E = m.moe->num_experts;
           std::vector<BenchCase> cs =
               cases::block_cases("fused_moe", m, o, {.params = 0, .in_features = H, .out_features = H});
           for (auto& c : cs) {
             const int64_t T = c.tokens, es = int64_t(dtype_size(c.dtype));
             const DType dt = c.dtype;
             c.make_inputs = [=](Device d, uint64_t seed) {
               return std::vector<Tensor>{cases::normal({T, H}, dt, d, seed, "hidden_states", 1.0),
                                          cases::normal({T, E}, dt, d, seed, "router_logits", 1.0)};
             };
             c.input_bytes = T * (H + E) * es;
             c.bytes = T * (2 * H + E) * es;
             c.flops = 0;
           }
           add_expert_work(cs, m);
           return cs;
         }});
}

}  // namespace kbn::KBN_VARIANT
