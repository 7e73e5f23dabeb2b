// qwen3_moe_for_causal_lm: Qwen3MoeForCausalLM (tasks/baseline/L4/qwen3_moe.h), serving HF "Qwen3MoeForCausalLM";
// measured end to end by `kb_nano eval`; tests/cpu/test_moe_models.cpp runs the tiny config on CPU (TP 1 and 2,
// sparse and dense layers, per-expert checkpoint names). No transformers fixture yet (tools/hf_reference.py makes one
// on the GPU machine). Its feature "qk_norm" gives rms_norm its per-head cases.
// Feature "norm_gemv": at one token its layers fold the RMSNorms into the projections after them (rms_norm_gemv).
#include "L4/qwen3_moe.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Qwen3MoeForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Qwen3MoeForCausalLM, "L4/qwen3_moe.h");
KBN_REQUIRE_CTOR(Qwen3MoeForCausalLM, "L4/qwen3_moe.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, Qwen3MoeForCausalLM>,
              KBN_WHERE("L4/qwen3_moe.h") ": class 'Qwen3MoeForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "qwen3_moe_for_causal_lm",
         .class_name = "Qwen3MoeForCausalLM",
         .level = 4,
         .header = "L4/qwen3_moe.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "qwen3_moe_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<Qwen3MoeForCausalLM>(a.model_config(), a.opts); },
             [](Qwen3MoeForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"Qwen3MoeForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<Qwen3MoeForCausalLM>(c, o);
         },
         .features = {"qk_norm", "norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
