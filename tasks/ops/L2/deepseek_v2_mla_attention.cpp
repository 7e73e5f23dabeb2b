// deepseek_v2_mla_attention: DeepseekV2MLAAttention (tasks/baseline/L2/deepseek_v2_mla_attention.h) of layer 0:
// q / kv_a projections, kv_a_layernorm, rope on the rope parts, the latent store, decompressed prefill or absorbed
// decode over the paged latent cache, o_proj. Cases for models with MLA (kv_lora_rank in the config).
#include "L2/deepseek_v2_mla_attention.h"
#include "configs/deepseek_v2.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(DeepseekV2MLAAttention)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(DeepseekV2MLAAttention, "L2/deepseek_v2_mla_attention.h");
KBN_REQUIRE_CTOR(DeepseekV2MLAAttention, "L2/deepseek_v2_mla_attention.h", const DeepseekV2Config&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(DeepseekV2MLAAttention, Tensor, forward, (const Tensor&, const Tensor&),
                   "L2/deepseek_v2_mla_attention.h");

namespace {

// Weight elements of one MLA block on one rank (tp 1 for blocks).
int64_t mla_params(const ModelView& m) {
  const MlaShape& a = *m.mla;
  const int64_t H = m.hidden_size, N = a.num_heads, q = a.qk_head_dim();
  const int64_t q_params = a.q_lora_rank > 0 ? H * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * N * q : H * N * q;
  return q_params + H * a.latent_size() + a.kv_lora_rank + a.kv_lora_rank * N * (a.qk_nope_head_dim + a.v_head_dim) +
         N * a.v_head_dim * H;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "deepseek_v2_mla_attention",
         .class_name = "DeepseekV2MLAAttention",
         .level = 2,
         .header = "L2/deepseek_v2_mla_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "deepseek_v2_mla_attention", 2,
             [](const OpArgs& a) {
               return std::make_unique<DeepseekV2MLAAttention>(DeepseekV2Config::from(a.model_config()),
                                                               "model.layers.0.self_attn", a.opts);
             },
             [](DeepseekV2MLAAttention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.mla) return {};
           const int64_t H = m.hidden_size;
           return cases::block_cases("deepseek_v2_mla_attention", m, o,
                                     {.params = mla_params(m), .in_features = H, .out_features = H, .attention = true});
         }});
}

}  // namespace kbn::KBN_VARIANT
