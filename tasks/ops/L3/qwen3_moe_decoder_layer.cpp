// qwen3_moe_decoder_layer: Qwen3MoeDecoderLayer (tasks/baseline/L3/qwen3_moe_decoder_layer.h) as the model's first
// sparse layer (the MoE is what this layer adds over qwen3_decoder_layer). Cases for Qwen3-MoE configs with at
// least one sparse layer.
#include "L3/qwen3_moe_decoder_layer.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Qwen3MoeDecoderLayer)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Qwen3MoeDecoderLayer, "L3/qwen3_moe_decoder_layer.h");
KBN_REQUIRE_CTOR(Qwen3MoeDecoderLayer, "L3/qwen3_moe_decoder_layer.h", const Qwen3MoeConfig&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(Qwen3MoeDecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/qwen3_moe_decoder_layer.h");

namespace {

int64_t first_sparse_layer(const Qwen3MoeConfig& c) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_sparse_layer(l)) return l;
  KBN_FAIL("qwen3_moe_decoder_layer: config has no sparse layer (num_experts, decoder_sparse_step, mlp_only_layers)");
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "qwen3_moe_decoder_layer",
         .class_name = "Qwen3MoeDecoderLayer",
         .level = 3,
         .header = "L3/qwen3_moe_decoder_layer.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "qwen3_moe_decoder_layer", 3,
             [](const OpArgs& a) {
               const Qwen3MoeConfig c = Qwen3MoeConfig::from(a.model_config());
               return std::make_unique<Qwen3MoeDecoderLayer>(
                   c, "model.layers." + std::to_string(first_sparse_layer(c)), a.opts);
             },
             [](Qwen3MoeDecoderLayer& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1], t[2]);
               return Tensors{h, res};
             }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.moe || m.moe->num_sparse_layers == 0 || !m.attention || !m.config->has("moe_intermediate_size") ||
               !m.config->has("num_experts"))
             return {};
           const AttentionShape& at = *m.attention;
           const int64_t H = m.hidden_size, D = at.head_dim;
           const int64_t params = H * (at.num_heads + 2 * at.num_kv_heads) * D + at.num_heads * D * H + 2 * D +
                                  H * m.moe->num_experts + 2 * H;
           std::vector<BenchCase> cs = cases::block_cases(
               "qwen3_moe_decoder_layer", m, o,
               {.params = params, .in_features = H, .out_features = H, .attention = true, .residual = true});
           add_expert_work(cs, m);
           return cs;
         },
         .router_inside = true});
}

}  // namespace kbn::KBN_VARIANT
