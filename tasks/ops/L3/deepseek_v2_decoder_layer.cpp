// deepseek_v2_decoder_layer: DeepseekV2DecoderLayer (tasks/baseline/L3/deepseek_v2_decoder_layer.h) as an MoE layer
// (MLA + routed and shared experts; a dense one for a config without experts). Cases for models with MLA.
#include "L3/deepseek_v2_decoder_layer.h"
#include "configs/deepseek_v2.h"
#include "ops/moe_facts.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(DeepseekV2DecoderLayer)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(DeepseekV2DecoderLayer, "L3/deepseek_v2_decoder_layer.h");
KBN_REQUIRE_CTOR(DeepseekV2DecoderLayer, "L3/deepseek_v2_decoder_layer.h", const DeepseekV2Config&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(DeepseekV2DecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/deepseek_v2_decoder_layer.h");

KBN_REGISTER_OPS(r) {
  r.add(
      {.name = "deepseek_v2_decoder_layer",
       .class_name = "DeepseekV2DecoderLayer",
       .level = 3,
       .header = "L3/deepseek_v2_decoder_layer.h",
       .ctor_args = {},
       .args = {"positions", "hidden_states", "residual"},
       .mutates = {"hidden_states", "residual"},
       .make = adapter(
           "deepseek_v2_decoder_layer", 3,
           [](const OpArgs& a) {
             // Layer 0 built as an MoE layer when the model has experts (the block cases hold one layer's cache,
             // which an attention finds by its layer index).
             DeepseekV2Config c = DeepseekV2Config::from(a.model_config());
             c.first_k_dense_replace = 0;
             c.moe_layer_freq = 1;
             return std::make_unique<DeepseekV2DecoderLayer>(c, "model.layers.0", a.opts);
           },
           [](DeepseekV2DecoderLayer& op, const Tensors& t) {
             auto [h, res] = op.forward(t[0], t[1], t[2]);
             return Tensors{h, res};
           }),
       .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
         if (!m.mla) return {};
         const MlaShape& a = *m.mla;
         const int64_t H = m.hidden_size, N = a.num_heads, q = a.qk_head_dim();
         const int64_t attn =
             (a.q_lora_rank > 0 ? H * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * N * q : H * N * q) +
             H * a.latent_size() + a.kv_lora_rank + a.kv_lora_rank * N * (a.qk_nope_head_dim + a.v_head_dim) +
             N * a.v_head_dim * H;
         const bool moe = m.moe && m.moe->num_sparse_layers > 0;
         const int64_t mlp = moe ? H * m.moe->num_experts + 3 * H * m.moe->shared_intermediate_size
                                 : 3 * H * m.config->get_int("intermediate_size");
         std::vector<BenchCase> cs = cases::block_cases(
             "deepseek_v2_decoder_layer", m, o,
             {.params = attn + mlp + 2 * H, .in_features = H, .out_features = H, .attention = true, .residual = true});
         if (moe) add_expert_work(cs, m);
         return cs;
       },
       // The output is routed + shared, two bf16-rounded terms often larger than their sum: a 1-ulp difference in the
       // routed term (the experts' rounded intermediates) lands whole on a small result. On the H200 the worst
       // elements were 2.12x the default atol_rms (8 of 37620, tiny-deepseek-v2, decode B=22, seed 5, normal
       // inputs) and 3.7x (1 of 37620, large inputs: terms of ~4k, ulp 16, summing to -163): 16-bit atol_rms is
       // 5x the default.
       .tolerance =
           [](DType dt) {
             Tolerance t = dtype_tolerance(dt);
             if (dt == DType::bf16 || dt == DType::f16) t.atol_rms *= 5;
             return t;
           }});
}

}  // namespace kbn::KBN_VARIANT
