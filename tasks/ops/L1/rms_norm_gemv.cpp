// rms_norm_gemv: class RMSNormGemv (tasks/baseline/L1/rms_norm_gemv.h), kb-nano's decode-step fusion of the RMSNorm
// (with the residual add) into the one-token linear that follows it, and of silu_and_mul / gelu_and_mul("tanh") into
// that linear's output; oracle: reference::fused_add_rms_norm / rms_norm (or the Gemma forms), reference::linear and
// reference::silu_and_mul / gelu_and_mul (tasks/reference/), composed in the op's CPU path.
// rms_norm_gemv_conv1d: class RMSNormGemvConv1d (same header), the same with Mamba-2's causal conv update folded into
// the linear's epilogue over the xBC columns; oracle: the above then reference::causal_conv1d_update on those columns.
// rms_norm_gated_gemv: class RMSNormGatedGemv (same header), Mamba-2's one-token gated norm folded into out_proj's GEMV;
// oracle: reference::rms_norm_gated then reference::linear.
#include "L1/rms_norm_gemv.h"
#include "configs/mamba2.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(RMSNormGemv)
KBN_FALLBACK_CLASS(RMSNormGemvConv1d)
KBN_FALLBACK_CLASS(RMSNormGatedGemv)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(RMSNormGemv, "L1/rms_norm_gemv.h");
KBN_REQUIRE_CTOR(RMSNormGemv, "L1/rms_norm_gemv.h", double, double, NormGemvAct);
KBN_REQUIRE_METHOD(RMSNormGemv, TensorPair, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&), "L1/rms_norm_gemv.h");
KBN_REQUIRE_METHOD(RMSNormGemv, TensorTriple, forward_normed,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&), "L1/rms_norm_gemv.h");
KBN_REQUIRE_CLASS(RMSNormGemvConv1d, "L1/rms_norm_gemv.h");
KBN_REQUIRE_CTOR(RMSNormGemvConv1d, "L1/rms_norm_gemv.h", double, int64_t, const std::string&);
KBN_REQUIRE_METHOD(RMSNormGemvConv1d, TensorPair, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&),
                   "L1/rms_norm_gemv.h");
KBN_REQUIRE_CLASS(RMSNormGatedGemv, "L1/rms_norm_gemv.h");
KBN_REQUIRE_CTOR(RMSNormGatedGemv, "L1/rms_norm_gemv.h", int64_t, double);
KBN_REQUIRE_METHOD(RMSNormGatedGemv, Tensor, forward,
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

template <class C>
concept kbn_has_norm_gemv_conv1d_supports = requires {
  static_cast<bool (*)(DType, int64_t, int64_t, int64_t)>(&C::kernel_supports);
};
static_assert(kbn_has_norm_gemv_conv1d_supports<RMSNormGemvConv1d>,
              "L1/rms_norm_gemv.h: class 'RMSNormGemvConv1d' must declare `static bool kernel_supports(DType, int64_t, "
              "int64_t, int64_t)` exactly as the baseline does");

// The mixer asks it whether the kernel takes a step (else it runs the gated norm and out_proj).
template <class C>
concept kbn_has_norm_gated_gemv_supports = requires {
  static_cast<bool (*)(DType, int64_t, int64_t, int64_t)>(&C::kernel_supports);
  static_cast<bool (*)(const Tensor&, int64_t)>(&C::applies);
};
static_assert(kbn_has_norm_gated_gemv_supports<RMSNormGatedGemv>,
              "L1/rms_norm_gemv.h: class 'RMSNormGatedGemv' must declare `static bool kernel_supports(DType, int64_t, "
              "int64_t, int64_t)` and `static bool applies(const Tensor&, int64_t)` exactly as the baseline does");

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

// Mamba-2's decode token: norm + in_proj with the conv update in its epilogue over the xBC columns (the layer's
// cache slots: a few to spare beside the token's).
std::vector<BenchCase> norm_gemv_conv1d_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (!m.has_feature("norm_gemv") || !m.mamba) return out;
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t H = m.hidden_size, es = int64_t(dtype_size(dt)), I = s.intermediate_size, cd = s.conv_dim(),
                W = s.conv_kernel;
  if (!RMSNormGemvConv1d::kernel_supports(dt, 1, H, W)) return out;
  const int64_t N = I + cd + s.num_heads, slots = 4;
  const bool f32 = Mamba2Config::from(*m.config).residual_in_fp32 && dt != DType::f32, has_bias = s.conv_bias;
  const DType res_dt = f32 ? DType::f32 : dt;
  const int64_t res_es = int64_t(dtype_size(res_dt));
  BenchCase b = cases::base("rms_norm_gemv_conv1d", m, 1, dt);
  b.label = "norm+in_proj+conv T=1 H=" + cases::str(H) + " N=" + cases::str(N) + " dim=" + cases::str(cd) +
            " width=" + cases::str(W) + (f32 ? " f32 residual" : "");
  b.args.values = {{"eps", m.rms_norm_eps}, {"conv_begin", double(I)}, {"silu", 1.0}};
  b.make_inputs = [=](Device d, uint64_t seed) {
    return std::vector<Tensor>{cases::normal({1, H}, dt, d, seed, "x", 1.0),
                               cases::normal({1, H}, res_dt, d, seed, "residual", 1.0),
                               cases::normal({H}, dt, d, seed, "norm_weight", 1.0),
                               cases::normal({N, H}, dt, d, seed, "weight", cases::kWeightStd),
                               Tensor(),  // no bias
                               cases::normal({slots, W - 1, cd}, dt, d, seed, "conv_states", 1.0),
                               cases::normal({cd, W}, dt, d, seed, "conv_weight", 0.5),
                               has_bias ? cases::normal({cd}, dt, d, seed, "conv_bias", 0.5) : Tensor(),
                               cases::permutation_prefix(slots, {1}, DType::i32, d, seed, "conv_state_indices")};
  };
  const int64_t taps = cd * W * es + (has_bias ? cd * es : 0);
  // The weight streamed once, x / residual / norm weight read, out and h written, the slot's conv state read and
  // written once, the taps read.
  b.bytes = (N * H + 2 * H + N) * es + 2 * H * res_es + 2 * (W - 1) * cd * es + taps + 4;
  b.flops = 2 * N * H + 5 * H + cd * (2 * W + 4);
  b.input_bytes = (N * H + 2 * H) * es + H * res_es + slots * (W - 1) * cd * es + taps + 4;
  b.output_numel = N + H + slots * (W - 1) * cd;
  out.push_back(std::move(b));
  return out;
}

// Mamba-2's one token: the gated norm of the scan's output (gate: in_proj's z columns) + out_proj.
std::vector<BenchCase> norm_gated_gemv_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (!m.has_feature("norm_gemv") || !m.mamba) return out;
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t H = m.hidden_size, es = int64_t(dtype_size(dt)), I = s.intermediate_size, gs = I / s.n_groups;
  if (!RMSNormGatedGemv::kernel_supports(dt, 1, I, gs)) return out;
  const int64_t row = I + s.conv_dim() + s.num_heads;  // in_proj's output row: [z | xBC | dt]
  BenchCase b = cases::base("rms_norm_gated_gemv", m, 1, dt);
  b.label = "gated_norm+out_proj T=1 I=" + cases::str(I) + " groups=" + cases::str(s.n_groups) + " H=" + cases::str(H);
  b.args.values = {{"group_size", double(gs)}, {"eps", m.rms_norm_eps}};
  b.make_inputs = [=](Device d, uint64_t seed) {
    Tensor proj = cases::normal({1, row}, dt, d, seed, "in_proj_out", 1.0);
    return std::vector<Tensor>{cases::normal({1, I}, dt, d, seed, "x", 1.0), proj.slice(1, 0, I),
                               cases::normal({I}, dt, d, seed, "norm_weight", 1.0),
                               cases::normal({H, I}, dt, d, seed, "weight", cases::kWeightStd),
                               Tensor()};  // no bias
  };
  // The weight streamed once; x, the gate and the norm weight read, the output written.
  b.bytes = (H * I + 3 * I + H) * es;
  b.flops = 2 * H * I + 9 * I;
  b.input_bytes = (H * I + 2 * I + row) * es;
  b.output_numel = H;
  out.push_back(std::move(b));
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "rms_norm_gated_gemv",
         .class_name = "RMSNormGatedGemv",
         .level = 1,
         .header = "L1/rms_norm_gemv.h",
         .ctor_args = {"group_size", "eps"},
         .args = {"x", "gate", "norm_weight", "weight", "bias"},
         .mutates = {},
         .make = adapter(
             "rms_norm_gated_gemv", 5,
             [](const OpArgs& a) { return std::make_unique<RMSNormGatedGemv>(a.get_int("group_size"), a.get("eps")); },
             [](RMSNormGatedGemv& op, const Tensors& t) {
               return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4])};
             }),
         .kernels = {"rms_norm_gemv_kernel"},
         .cases = norm_gated_gemv_cases});
  r.add({.name = "rms_norm_gemv_conv1d",
         .class_name = "RMSNormGemvConv1d",
         .level = 1,
         .header = "L1/rms_norm_gemv.h",
         .ctor_args = {"eps", "conv_begin", "silu"},
         .args = {"x", "residual", "norm_weight", "weight", "bias", "conv_states", "conv_weight", "conv_bias",
                  "conv_state_indices"},
         .mutates = {"conv_states"},
         .make = adapter(
             "rms_norm_gemv_conv1d", 9,
             [](const OpArgs& a) {
               return std::make_unique<RMSNormGemvConv1d>(a.get("eps"), int64_t(a.get("conv_begin")),
                                                          a.get("silu", 1.0) != 0 ? "silu" : "");
             },
             [](RMSNormGemvConv1d& op, const Tensors& t) {
               auto [y, h] = op.forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
               return h.defined() ? Tensors{y, h, t[5]} : Tensors{y, t[5]};
             }),
         .kernels = {"rms_norm_gemv_kernel"},
         .cases = norm_gemv_conv1d_cases});
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
