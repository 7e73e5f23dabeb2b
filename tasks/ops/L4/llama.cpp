// llama_for_causal_lm: LlamaForCausalLM (tasks/baseline/L4/llama.h), serving HF "LlamaForCausalLM"; measured end
// to end by `kb_nano eval`, checked against transformers by tests/cpu/test_llama_hf.cpp.
// Feature "norm_gemv": at one token its layers fold the RMSNorms into the projections after them (rms_norm_gemv).
#include "L4/llama.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(LlamaForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(LlamaForCausalLM, "L4/llama.h");
KBN_REQUIRE_CTOR(LlamaForCausalLM, "L4/llama.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, LlamaForCausalLM>,
              KBN_WHERE("L4/llama.h") ": class 'LlamaForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "llama_for_causal_lm",
         .class_name = "LlamaForCausalLM",
         .level = 4,
         .header = "L4/llama.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "llama_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<LlamaForCausalLM>(a.model_config(), a.opts); },
             [](LlamaForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"LlamaForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<LlamaForCausalLM>(c, o);
         },
         .features = {"norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
