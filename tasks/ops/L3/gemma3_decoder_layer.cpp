// gemma3_decoder_layer: Gemma3DecoderLayer (tasks/baseline/L3/gemma3_decoder_layer.h) as layer 0.
#include "L3/gemma3_decoder_layer.h"
#include "kbn/compare.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Gemma3DecoderLayer)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Gemma3DecoderLayer, "L3/gemma3_decoder_layer.h");
KBN_REQUIRE_CTOR(Gemma3DecoderLayer, "L3/gemma3_decoder_layer.h", const Gemma3TextConfig&, int64_t,
                 const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(Gemma3DecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/gemma3_decoder_layer.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gemma3_decoder_layer",
         .class_name = "Gemma3DecoderLayer",
         .level = 3,
         .header = "L3/gemma3_decoder_layer.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "gemma3_decoder_layer", 3,
             [](const OpArgs& a) {
               return std::make_unique<Gemma3DecoderLayer>(Gemma3TextConfig::from(a.model_config()), 0,
                                                           "model.layers.0", a.opts);
             },
             [](Gemma3DecoderLayer& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1], t[2]);
               return Tensors{h, res};
             }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim, I = *m.intermediate_size;
           // Attention (qkv, o, q/k norms), the MLP and four hidden-size norms.
           const int64_t params =
               H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H + 2 * D + 3 * H * I + 4 * H;
           return cases::block_cases("gemma3_decoder_layer", m, o,
                                     {.params = params,
                                      .in_features = H,
                                      .out_features = H,
                                      .attention = true,
                                      .residual = true});
         },
         // The first output is post_feedforward_layernorm(mlp): every channel scaled by its own gain (1 + w), so an
         // element's rounding error follows its channel's gain, while the tolerance's atol is measured against the
         // whole output's rms. In bf16 the default (two ulps) was exceeded by 1 element of 19200 on the H200 (error
         // 0.0159 against 0.0155 allowed, T=300, seed 5): atol_rms is 1.5x the default there; other dtypes as usual.
         .tolerance =
             [](DType dt) {
               Tolerance t = dtype_tolerance(dt);
               if (dt == DType::bf16) t.atol_rms *= 1.5;
               return t;
             }});
}

}  // namespace kbn::KBN_VARIANT
