// attention: the paged attention layer (tasks/baseline/L2/attention.h: store_kvcache, or fused_rope_kvcache with the
// rope, then the prefill and decode kernels, which carry the cases).
#include "L2/attention.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Attention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Attention, "L2/attention.h");
KBN_REQUIRE_CTOR(Attention, "L2/attention.h", int64_t, int64_t, double, int64_t, const std::string&);
KBN_REQUIRE_CTOR(Attention, "L2/attention.h", int64_t, int64_t, double, int64_t, const std::string&, int64_t, double,
                 const Tensor*);
KBN_REQUIRE_METHOD(Attention, LayerCacheSpec, cache_spec, (DType) const, "L2/attention.h");
KBN_REQUIRE_METHOD(Attention, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&), "L2/attention.h");
// LlamaAttention and GptOssAttention hand it the qkv rows and their rope (fused_rope_kvcache where it applies).
KBN_REQUIRE_METHOD(Attention, Tensor, forward_rope, (const Tensor&, const Tensor&, RotaryEmbedding&),
                   "L2/attention.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "attention",
         .class_name = "Attention",
         .level = 2,
         .header = "L2/attention.h",
         .ctor_args = {},
         .args = {"query", "key", "value"},
         .mutates = {},
         .make = adapter(
             "attention", 3,
             [](const OpArgs& a) {
               const ModelView m = view_of(a);
               KBN_CHECK(m.attention, "attention: config ", a.model_config().source(), " has no attention");
               const AttentionShape& at = *m.attention;
               return std::make_unique<Attention>(at.num_heads, at.head_dim, 1.0 / std::sqrt(double(at.head_dim)),
                                                  at.num_kv_heads, "model.layers.0.self_attn.attn");
             },
             [](Attention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], t[2])}; })});
}

}  // namespace kbn::KBN_VARIANT
