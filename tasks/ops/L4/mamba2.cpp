// mamba2_for_causal_lm: Mamba2ForCausalLM (tasks/baseline/L4/mamba2.h), serving HF "Mamba2ForCausalLM"; measured end to
// end by `kb_nano eval`, checked against transformers by tests/cpu/test_mamba2_hf.cpp. Feature "norm_gemv": at one
// token its layers fold the RMSNorm (fp32 residual included) into in_proj (rms_norm_gemv).
#include "L4/mamba2.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Mamba2ForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Mamba2ForCausalLM, "L4/mamba2.h");
KBN_REQUIRE_CTOR(Mamba2ForCausalLM, "L4/mamba2.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, Mamba2ForCausalLM>,
              KBN_WHERE("L4/mamba2.h") ": class 'Mamba2ForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mamba2_for_causal_lm",
         .class_name = "Mamba2ForCausalLM",
         .level = 4,
         .header = "L4/mamba2.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "mamba2_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<Mamba2ForCausalLM>(a.model_config(), a.opts); },
             [](Mamba2ForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"Mamba2ForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<Mamba2ForCausalLM>(c, o);
         },
         .features = {"norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
