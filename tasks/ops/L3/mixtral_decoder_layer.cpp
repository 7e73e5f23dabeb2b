// mixtral_decoder_layer: MixtralDecoderLayer (tasks/baseline/L3/mixtral_decoder_layer.h) as layer 0. Cases for
// Mixtral configs (those naming num_local_experts).
#include "L3/mixtral_decoder_layer.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MixtralDecoderLayer)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MixtralDecoderLayer, "L3/mixtral_decoder_layer.h");
KBN_REQUIRE_CTOR(MixtralDecoderLayer, "L3/mixtral_decoder_layer.h", const MixtralConfig&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(MixtralDecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/mixtral_decoder_layer.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mixtral_decoder_layer",
         .class_name = "MixtralDecoderLayer",
         .level = 3,
         .header = "L3/mixtral_decoder_layer.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "mixtral_decoder_layer", 3,
             [](const OpArgs& a) {
               return std::make_unique<MixtralDecoderLayer>(MixtralConfig::from(a.model_config()), "model.layers.0",
                                                            a.opts);
             },
             [](MixtralDecoderLayer& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1], t[2]);
               return Tensors{h, res};
             }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe || !m.attention || !m.config->has("num_local_experts")) return {};
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim;
           const int64_t params =
               H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H + H * m.moe->num_experts + 2 * H;
           std::vector<BenchCase> cs = cases::block_cases(
               "mixtral_decoder_layer", m, o,
               {.params = params, .in_features = H, .out_features = H, .attention = true, .residual = true});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
