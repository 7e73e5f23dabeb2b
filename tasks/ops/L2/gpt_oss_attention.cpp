// gpt_oss_attention: GptOssAttention (tasks/baseline/L2/gpt_oss_attention.h) of layer 0 (a sliding layer in
// gpt-oss's configs): qkv projection with bias, YaRN rotary, windowed paged attention with sinks, output projection.
#include "L2/gpt_oss_attention.h"
#include "configs/gpt_oss.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(GptOssAttention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(GptOssAttention, "L2/gpt_oss_attention.h");
KBN_REQUIRE_CTOR(GptOssAttention, "L2/gpt_oss_attention.h", const GptOssConfig&, int64_t, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(GptOssAttention, Tensor, forward, (const Tensor&, const Tensor&), "L2/gpt_oss_attention.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gpt_oss_attention",
         .class_name = "GptOssAttention",
         .level = 2,
         .header = "L2/gpt_oss_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "gpt_oss_attention", 2,
             [](const OpArgs& a) {
               return std::make_unique<GptOssAttention>(GptOssConfig::from(a.model_config()), 0,
                                                        "model.layers.0.self_attn", a.opts);
             },
             [](GptOssAttention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.attention || !m.has_feature("attention_sinks")) return {};
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim, qkv = (at.num_heads + 2 * at.num_kv_heads) * D;
           // qkv and o weights and biases, and the sinks.
           const int64_t params = H * qkv + qkv + at.num_heads * D * H + H + at.num_heads;
           return cases::block_cases("gpt_oss_attention", m, o,
                                     {.params = params, .in_features = H, .out_features = H, .attention = true});
         }});
}

}  // namespace kbn::KBN_VARIANT
