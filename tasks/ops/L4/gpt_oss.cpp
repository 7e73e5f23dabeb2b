// gpt_oss_for_causal_lm: GptOssForCausalLM (tasks/baseline/L4/gpt_oss.h), serving HF "GptOssForCausalLM" (gpt-oss-20b
// and -120b, bf16 experts); checked against transformers by tests/cpu/test_gpt_oss_hf.cpp. Its features:
// "sliding_window" (its sliding layers apply the config's window) and "attention_sinks" (a learned sink logit per
// query head joins every softmax) and "norm_gemv" (at one token its layers fold the input norm into qkv_proj:
// rms_norm_gemv).
#include "L4/gpt_oss.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(GptOssForCausalLM)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(GptOssForCausalLM, "L4/gpt_oss.h");
KBN_REQUIRE_CTOR(GptOssForCausalLM, "L4/gpt_oss.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, GptOssForCausalLM>,
              KBN_WHERE("L4/gpt_oss.h") ": class 'GptOssForCausalLM' must derive from kbn::CausalLM");

KBN_REGISTER_OPS(r) {
  r.add({.name = "gpt_oss_for_causal_lm",
         .class_name = "GptOssForCausalLM",
         .level = 4,
         .header = "L4/gpt_oss.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "gpt_oss_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<GptOssForCausalLM>(a.model_config(), a.opts); },
             [](GptOssForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"GptOssForCausalLM"},
         .model_types = {{"gpt_oss", "GptOssForCausalLM"}},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<GptOssForCausalLM>(c, o);
         },
         .features = {"sliding_window", "attention_sinks", "norm_gemv"}});
}

}  // namespace kbn::KBN_VARIANT
