// mixtral_for_causal_lm: MixtralForCausalLM (tasks/baseline/L4/mixtral.h), serving HF "MixtralForCausalLM"; measured
// end to end by `kb_nano eval`; tests/cpu/test_moe_models.cpp runs the tiny config on CPU (TP 1 and 2, per-expert
// checkpoint names). No transformers fixture yet (tools/hf_reference.py makes one on the GPU machine).
// Feature "norm_gemv": at one token its layers fold the RMSNorms into the projections after them (rms_norm_gemv).
#include "L4/mixtral.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MixtralForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MixtralForCausalLM, "L4/mixtral.h");
KBN_REQUIRE_CTOR(MixtralForCausalLM, "L4/mixtral.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, MixtralForCausalLM>,
              KBN_WHERE("L4/mixtral.h") ": class 'MixtralForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "mixtral_for_causal_lm",
         .class_name = "MixtralForCausalLM",
         .level = 4,
         .header = "L4/mixtral.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "mixtral_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<MixtralForCausalLM>(a.model_config(), a.opts); },
             [](MixtralForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"MixtralForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<MixtralForCausalLM>(c, o);
         },
         .features = {"norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
