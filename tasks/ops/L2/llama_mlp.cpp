// llama_mlp: LlamaMLP (tasks/baseline/L2/llama_mlp.h) of layer 0, gate_up GEMM -> silu_and_mul -> down GEMM;
// vLLM's Qwen2MLP/Qwen3MLP is the same block, and Qwen3 uses this class.
#include "L2/llama_mlp.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(LlamaMLP)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(LlamaMLP, "L2/llama_mlp.h");
KBN_REQUIRE_CTOR(LlamaMLP, "L2/llama_mlp.h", int64_t, int64_t, const std::string&, bool, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(LlamaMLP, Tensor, forward, (const Tensor&), "L2/llama_mlp.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "llama_mlp",
         .class_name = "LlamaMLP",
         .level = 2,
         .header = "L2/llama_mlp.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "llama_mlp", 1,
             [](const OpArgs& a) {
               const ModelConfig& c = a.model_config();
               return std::make_unique<LlamaMLP>(c.get_int("hidden_size"), c.get_int("intermediate_size"),
                                                 c.get_string("hidden_act", "silu"), c.get_bool("mlp_bias", false),
                                                 "model.layers.0.mlp", a.opts);
             },
             [](LlamaMLP& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.intermediate_size) return {};
           const int64_t H = m.hidden_size, I = *m.intermediate_size;
           return cases::block_cases("llama_mlp", m, o, {.params = 3 * H * I, .in_features = H, .out_features = H});
         }});
}

}  // namespace kbn::KBN_VARIANT
