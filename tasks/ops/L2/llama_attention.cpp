// llama_attention: LlamaAttention (tasks/baseline/L2/llama_attention.h) of layer 0: qkv projection, rotary,
// paged attention, output projection.
#include "L2/llama_attention.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(LlamaAttention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(LlamaAttention, "L2/llama_attention.h");
KBN_REQUIRE_CTOR(LlamaAttention, "L2/llama_attention.h", const LlamaConfig&, int64_t, int64_t, int64_t, double,
                 const RopeScaling&, int64_t, bool, const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(LlamaAttention, Tensor, forward, (const Tensor&, const Tensor&), "L2/llama_attention.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "llama_attention",
         .class_name = "LlamaAttention",
         .level = 2,
         .header = "L2/llama_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "llama_attention", 2,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<LlamaAttention>(c, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                                       c.rope_theta, c.rope_scaling, c.max_position_embeddings,
                                                       c.attention_bias, "model.layers.0.self_attn", a.opts);
             },
             [](LlamaAttention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim;
           const int64_t params = H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H;
           return cases::block_cases("llama_attention", m, o,
                                     {.params = params, .in_features = H, .out_features = H, .attention = true});
         }});
}

}  // namespace kbn::KBN_VARIANT
