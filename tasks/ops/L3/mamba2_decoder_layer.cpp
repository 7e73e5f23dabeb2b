// mamba2_decoder_layer: Mamba2DecoderLayer (tasks/baseline/L3/mamba2_decoder_layer.h) as layer 0, its residual in fp32
// when the config says residual_in_fp32.
#include "L3/mamba2_decoder_layer.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Mamba2DecoderLayer)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Mamba2DecoderLayer, "L3/mamba2_decoder_layer.h");
KBN_REQUIRE_CTOR(Mamba2DecoderLayer, "L3/mamba2_decoder_layer.h", const Mamba2Config&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(Mamba2DecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&),
                   "L3/mamba2_decoder_layer.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mamba2_decoder_layer",
         .class_name = "Mamba2DecoderLayer",
         .level = 3,
         .header = "L3/mamba2_decoder_layer.h",
         .ctor_args = {},
         .args = {"hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "mamba2_decoder_layer", 2,
             [](const OpArgs& a) {
               return std::make_unique<Mamba2DecoderLayer>(Mamba2Config::from(a.model_config()), "backbone.layers.0",
                                                           a.opts);
             },
             [](Mamba2DecoderLayer& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1]);
               return Tensors{h, res};
             }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.mamba) return {};
           const MambaShape& s = *m.mamba;
           const Mamba2Config c = Mamba2Config::from(*m.config);
           const int64_t H = m.hidden_size, I = s.intermediate_size, cd = s.conv_dim();
           const int64_t params = H * (I + cd + s.num_heads) + cd * (s.conv_kernel + (s.conv_bias ? 1 : 0)) +
                                  3 * s.num_heads + I + I * H + H;
           return cases::block_cases(
               "mamba2_decoder_layer", m, o,
               {.params = params,
                .in_features = H,
                .out_features = H,
                .residual = true,
                .state_shapes = {{s.conv_kernel - 1, cd}, {s.num_heads, s.head_dim, s.state_size}},
                .residual_f32 = c.residual_in_fp32});
         }});
}

}  // namespace kbn::KBN_VARIANT
