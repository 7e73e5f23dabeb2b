// qwen3_for_causal_lm: Qwen3ForCausalLM (tasks/baseline/L4/qwen3.h), serving HF "Qwen3ForCausalLM"; measured end to
// end by `kb_nano eval`, checked against transformers by tests/cpu/test_qwen3_hf.cpp. Its feature "qk_norm" gives
// rms_norm its per-head cases.
// Feature "norm_gemv": at one token its layers fold the RMSNorms into the projections after them (rms_norm_gemv).
#include "L4/qwen3.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Qwen3ForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Qwen3ForCausalLM, "L4/qwen3.h");
KBN_REQUIRE_CTOR(Qwen3ForCausalLM, "L4/qwen3.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, Qwen3ForCausalLM>,
              KBN_WHERE("L4/qwen3.h") ": class 'Qwen3ForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "qwen3_for_causal_lm",
         .class_name = "Qwen3ForCausalLM",
         .level = 4,
         .header = "L4/qwen3.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "qwen3_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<Qwen3ForCausalLM>(a.model_config(), a.opts); },
             [](Qwen3ForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"Qwen3ForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<Qwen3ForCausalLM>(c, o);
         },
         .features = {"qk_norm", "norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
