// deepseek_v2_for_causal_lm: DeepseekV2ForCausalLM (tasks/baseline/L4/deepseek_v2.h), serving HF
// "DeepseekV2ForCausalLM" and "DeepseekV3ForCausalLM"; measured end to end by `kb_nano eval`;
// tests/cpu/test_deepseek_hf.cpp matches the transformers fixture of the tiny config (tests/fixtures/tiny-deepseek-v2).
#include "L4/deepseek_v2.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(DeepseekV2ForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(DeepseekV2ForCausalLM, "L4/deepseek_v2.h");
KBN_REQUIRE_CTOR(DeepseekV2ForCausalLM, "L4/deepseek_v2.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, DeepseekV2ForCausalLM>,
              KBN_WHERE("L4/deepseek_v2.h") ": class 'DeepseekV2ForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "deepseek_v2_for_causal_lm",
         .class_name = "DeepseekV2ForCausalLM",
         .level = 4,
         .header = "L4/deepseek_v2.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "deepseek_v2_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<DeepseekV2ForCausalLM>(a.model_config(), a.opts); },
             [](DeepseekV2ForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         // V3 (and R1) is V2's code with a q_lora query and noaux_tc routing, as vLLM's DeepseekV3ForCausalLM is.
         .architectures = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<DeepseekV2ForCausalLM>(c, o);
         }});
}

}  // namespace kbn::KBN_VARIANT
