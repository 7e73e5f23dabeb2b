// gemma3_attention: Gemma3Attention (tasks/baseline/L2/gemma3_attention.h) of layer 0 (a sliding layer in every
// Gemma-3 config): qkv projection, per-head q/k GemmaRMSNorm, rotary, windowed paged attention, output projection.
#include "L2/gemma3_attention.h"
#include "configs/gemma3.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Gemma3Attention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Gemma3Attention, "L2/gemma3_attention.h");
KBN_REQUIRE_CTOR(Gemma3Attention, "L2/gemma3_attention.h", const Gemma3TextConfig&, int64_t, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(Gemma3Attention, Tensor, forward, (const Tensor&, const Tensor&), "L2/gemma3_attention.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gemma3_attention",
         .class_name = "Gemma3Attention",
         .level = 2,
         .header = "L2/gemma3_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "gemma3_attention", 2,
             [](const OpArgs& a) {
               return std::make_unique<Gemma3Attention>(Gemma3TextConfig::from(a.model_config()), 0,
                                                        "model.layers.0.self_attn", a.opts);
             },
             [](Gemma3Attention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim;
           // qkv and o weights, and the two head_dim norm weights.
           const int64_t params = H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H + 2 * D;
           return cases::block_cases("gemma3_attention", m, o,
                                     {.params = params, .in_features = H, .out_features = H, .attention = true});
         }});
}

}  // namespace kbn::KBN_VARIANT
