// rms_norm_gemv: class RMSNormGemv (tasks/baseline/L1/rms_norm_gemv.h), kb-nano's decode-step fusion of the RMSNorm
// (with the residual add) into the one-token linear that follows it, and of silu_and_mul / gelu_and_mul("tanh") into
// that linear's output; oracle: reference::fused_add_rms_norm / rms_norm (or the Gemma forms), reference::linear and
// reference::silu_and_mul / gelu_and_mul (tasks/reference/), composed in the op's CPU path.
#include "L1/rms_norm_gemv.h"
#include "configs/mamba2.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(RMSNormGemv)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(RMSNormGemv, "L1/rms_norm_gemv.h");
KBN_REQUIRE_CTOR(RMSNormGemv, "L1/rms_norm_gemv.h", double, double, NormGemvAct);
KBN_REQUIRE_METHOD(RMSNormGemv, TensorPair, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&), "L1/rms_norm_gemv.h");
KBN_REQUIRE_METHOD(RMSNormGemv, TensorTriple, forward_normed,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&), "L1/rms_norm_gemv.h");
// The decoder layers ask it whether the kernel takes a step (else they run the norm, the linear and the activation).
template <class C>
concept kbn_has_norm_gemv_supports = requires {
  static_cast<bool (*)(DType, int64_t, int64_t)>(&C::kernel_supports);
  static_cast<bool (*)(const Tensor&)>(&C::applies);
};
static_assert(kbn_has_norm_gemv_supports<RMSNormGemv>,
              "L1/rms_norm_gemv.h: class 'RMSNormGemv' must declare `static bool kernel_supports(DType, int64_t, "
              "int64_t)` and `static bool applies(const Tensor&)` exactly as the baseline does");

namespace {

// The decoder layers of the models declaring "norm_gemv" take it at one token: the input norm with the qkv
// projection (the first layer's without a residual, the others' with one) and, where the layer has a dense MLP, the
// norm before it with the gate/up projection and the activation (silu*mul; Gemma-3: GemmaRMSNorm's 1 + w and
// gelu_tanh*mul). One token only: from two on the layers run the norm, cuBLASLt and the activation.
//
// Mamba-2's layers fold their one norm into in_proj ([z | xBC | dt] rows), its residual stream fp32 where the config
// says residual_in_fp32.
std::vector<BenchCase> norm_gemv_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (!m.has_feature("norm_gemv") || !(m.attention || m.mamba)) return out;
  const DType dt = o.dtype;
  const int64_t H = m.hidden_size, es = int64_t(dtype_size(dt));
  if (!RMSNormGemv::kernel_supports(dt, 1, H)) return out;
  const bool gemma = m.has_feature("gemma_norm");
  const NormGemvAct mlp_act = gemma ? NormGemvAct::gelu_tanh_and_mul : NormGemvAct::silu_and_mul;
  struct Fusion {
    std::string name;
    int64_t n;
    bool residual;
    NormGemvAct act;
    bool residual_f32 = false;
  };
  std::vector<Fusion> fusions;
  if (m.attention) {
    const AttentionShape& a = *m.attention;
    fusions = {{"input_norm+qkv", (a.num_heads + 2 * a.num_kv_heads) * a.head_dim, true, NormGemvAct::none},
               {"first_norm+qkv", (a.num_heads + 2 * a.num_kv_heads) * a.head_dim, false, NormGemvAct::none}};
  } else {
    const MambaShape& s = *m.mamba;
    const bool f32 = Mamba2Config::from(*m.config).residual_in_fp32 && dt != DType::f32;
    const int64_t n = s.intermediate_size + s.conv_dim() + s.num_heads;
    fusions = {{"norm+in_proj", n, true, NormGemvAct::none, f32}, {"first_norm+in_proj", n, false, NormGemvAct::none}};
  }
  if (m.intermediate_size)
    fusions.push_back({std::string("mlp_norm+gate_up+") + (gemma ? "gelu_tanh" : "silu"), 2 * *m.intermediate_size,
                       true, mlp_act});
  for (const Fusion& f : fusions) {
    const bool gated = f.act != NormGemvAct::none;
    const int64_t T = 1, N = f.n, out_n = gated ? N / 2 : N;
    BenchCase b = cases::base("rms_norm_gemv", m, T, dt);
    b.label = f.name + " T=1 H=" + cases::str(H) + " N=" + cases::str(N) + (f.residual_f32 ? " f32 residual" : "");
    b.args.values = {{"eps", m.rms_norm_eps}, {"weight_offset", gemma ? 1.0 : 0.0}, {"act", double(int(f.act))}};
    const bool residual = f.residual;
    const DType res_dt = f.residual_f32 ? DType::f32 : dt;
    const int64_t res_es = int64_t(dtype_size(res_dt));
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, H}, dt, d, seed, "x", 1.0),
                                 residual ? cases::normal({T, H}, res_dt, d, seed, "residual", 1.0) : Tensor(),
                                 cases::normal({H}, dt, d, seed, "norm_weight", 1.0),
                                 cases::normal({N, H}, dt, d, seed, "weight", cases::kWeightStd),
                                 Tensor()};  // no bias
    };
    // The weight streamed once; x (and the residual) and the norm weight read, the output (and h) written.
    b.bytes = (N * H + H + H + out_n) * es + (residual ? 2 * H * res_es : 0);
    b.flops = 2 * N * H + (residual ? 5 : 4) * H + (gated ? 4 * out_n : 0);
    b.input_bytes = (N * H + H + H) * es + (residual ? H * res_es : 0);
    b.output_numel = out_n + (residual ? H : 0);
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "rms_norm_gemv",
         .class_name = "RMSNormGemv",
         .level = 1,
         .header = "L1/rms_norm_gemv.h",
         .ctor_args = {"eps", "weight_offset", "act"},
         .args = {"x", "residual", "norm_weight", "weight", "bias"},
         .mutates = {},
         .make = adapter(
             "rms_norm_gemv", 5,
             [](const OpArgs& a) {
               return std::make_unique<RMSNormGemv>(a.get("eps"), a.get("weight_offset"),
                                                    static_cast<NormGemvAct>(int(a.get("act"))));
             },
             [](RMSNormGemv& op, const Tensors& t) {
               auto [y, h] = op.forward(t[0], t[1], t[2], t[3], t[4]);
               return h.defined() ? Tensors{y, h} : Tensors{y};
             }),
         .kernels = {"rms_norm_gemv_kernel"},
         .cases = norm_gemv_cases});
}

}  // namespace kbn::KBN_VARIANT
