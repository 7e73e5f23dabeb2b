// mixer2_rms_norm_gated: class Mixer2RMSNormGated (tasks/baseline/L1/mixer2_rms_norm_gated.h), Mamba-2's gated group
// RMS norm (vLLM Mixer2RMSNormGated); oracle reference::rms_norm_gated (tasks/reference/mamba.cpp).
#include "L1/mixer2_rms_norm_gated.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Mixer2RMSNormGated)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Mixer2RMSNormGated, "L1/mixer2_rms_norm_gated.h");
KBN_REQUIRE_CTOR(Mixer2RMSNormGated, "L1/mixer2_rms_norm_gated.h", int64_t, int64_t, double, const ParamOptions&);
KBN_REQUIRE_METHOD(Mixer2RMSNormGated, Tensor, forward, (const Tensor&, const Tensor&), "L1/mixer2_rms_norm_gated.h");

namespace {

// Every step's tokens: x is the scan's output [T, heads * head_dim], gate the z columns of the in_proj output.
std::vector<BenchCase> mixer2_rms_norm_gated_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mamba) return {};
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), I = s.intermediate_size, G = s.n_groups;
  const int64_t row = I + s.conv_dim() + s.num_heads;  // in_proj's output row: [z | xBC | dt]
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("mixer2_rms_norm_gated", m, T, dt);
    b.label = "T=" + cases::str(T) + " hidden=" + cases::str(I) + " groups=" + cases::str(G) +
              " group_size=" + cases::str(I / G);
    b.args.values = {{"hidden_size", double(I)}, {"n_groups", double(G)}, {"eps", m.rms_norm_eps}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      Tensor proj = cases::normal({T, row}, dt, d, seed, "in_proj_out", 1.0);
      return std::vector<Tensor>{cases::normal({T, I}, dt, d, seed, "x", 1.0), proj.slice(1, 0, I)};
    };
    b.bytes = 3 * T * I * es + I * es;  // x and gate read, out written, the weight read once
    b.flops = 9 * T * I;                // silu (exp, add, divide), the gate product, the square sum, the scaling
    b.input_bytes = T * I * es + T * row * es;
    b.output_numel = T * I;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "mixer2_rms_norm_gated",
         .class_name = "Mixer2RMSNormGated",
         .level = 1,
         .header = "L1/mixer2_rms_norm_gated.h",
         .ctor_args = {"hidden_size", "n_groups", "eps"},
         .args = {"x", "gate"},
         .mutates = {},
         .make = adapter(
             "mixer2_rms_norm_gated", 2,
             [](const OpArgs& a) {
               return std::make_unique<Mixer2RMSNormGated>(a.get_int("hidden_size"), a.get_int("n_groups"),
                                                           a.get("eps"), a.opts);
             },
             [](Mixer2RMSNormGated& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .kernels = {"mixer2_rms_norm_gated"},
         .cases = mixer2_rms_norm_gated_cases});
}

}  // namespace kbn::KBN_VARIANT
