// qwen3_attention: Qwen3Attention (tasks/baseline/L2/qwen3_attention.h) of layer 0: qkv projection, per-head q/k
// RMSNorm, rotary, paged attention, output projection.
#include "L2/qwen3_attention.h"
#include "configs/qwen3.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Qwen3Attention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Qwen3Attention, "L2/qwen3_attention.h");
KBN_REQUIRE_CTOR(Qwen3Attention, "L2/qwen3_attention.h", int64_t, int64_t, int64_t, int64_t, int64_t, double, bool,
                 double, const RopeScaling&, const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(Qwen3Attention, Tensor, forward, (const Tensor&, const Tensor&), "L2/qwen3_attention.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "qwen3_attention",
         .class_name = "Qwen3Attention",
         .level = 2,
         .header = "L2/qwen3_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "qwen3_attention", 2,
             [](const OpArgs& a) {
               const Qwen3Config c = Qwen3Config::from(a.model_config());
               return std::make_unique<Qwen3Attention>(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                                       c.max_position_embeddings, c.head_dim, c.rms_norm_eps,
                                                       c.attention_bias, c.rope_theta, c.rope_scaling,
                                                       "model.layers.0.self_attn", a.opts);
             },
             [](Qwen3Attention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim;
           // qkv and o weights, and the two head_dim norm weights.
           const int64_t params = H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H + 2 * D;
           return cases::block_cases("qwen3_attention", m, o,
                                     {.params = params, .in_features = H, .out_features = H, .attention = true});
         }});
}

}  // namespace kbn::KBN_VARIANT
