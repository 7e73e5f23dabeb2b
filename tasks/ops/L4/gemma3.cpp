// gemma3_for_causal_lm: Gemma3ForCausalLM (tasks/baseline/L4/gemma3.h), serving HF "Gemma3ForCausalLM" (Gemma-3's
// text models). Its features: "sliding_window" (its sliding layers apply the config's window) and "logits_soft_cap"
// (attention applies attn_logit_softcapping when a config sets it), "gemma_norm" (its per-head q/k norms scale by
// 1 + weight: fused_qk_norm_rope's cases take weight_offset 1).
// Feature "norm_gemv": at one token its layers fold the input and pre-feedforward GemmaRMSNorms into the projections
// after them (rms_norm_gemv).
#include "L4/gemma3.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Gemma3ForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Gemma3ForCausalLM, "L4/gemma3.h");
KBN_REQUIRE_CTOR(Gemma3ForCausalLM, "L4/gemma3.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, Gemma3ForCausalLM>,
              KBN_WHERE("L4/gemma3.h") ": class 'Gemma3ForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gemma3_for_causal_lm",
         .class_name = "Gemma3ForCausalLM",
         .level = 4,
         .header = "L4/gemma3.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "gemma3_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<Gemma3ForCausalLM>(a.model_config(), a.opts); },
             [](Gemma3ForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         // Gemma3ForConditionalGeneration (the published Gemma-3 4B-27B checkpoints): its text model only; the
         // vision tower's tensors are not read.
         .architectures = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
         .model_types = {{"gemma3_text", "Gemma3ForCausalLM"}, {"gemma3", "Gemma3ForConditionalGeneration"}},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<Gemma3ForCausalLM>(c, o);
         },
         .features = {"sliding_window", "logits_soft_cap", "gemma_norm", "norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
