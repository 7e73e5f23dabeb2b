// rms_norm and fused_add_rms_norm: class RMSNorm (tasks/baseline/L1/rms_norm.h), oracle
// tasks/reference/norm.cpp.
#include "L1/rms_norm.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(RMSNorm)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(RMSNorm, "L1/rms_norm.h");
KBN_REQUIRE_CTOR(RMSNorm, "L1/rms_norm.h", int64_t, double, const ParamOptions&);
KBN_REQUIRE_METHOD(RMSNorm, Tensor, forward, (const Tensor&), "L1/rms_norm.h");
KBN_REQUIRE_METHOD(RMSNorm, TensorPair, forward, (const Tensor&, const Tensor&), "L1/rms_norm.h");

// The per-head q/k norms' weight is read by L2/attention.h's norm_rope_qkv (fused_qk_norm_rope takes it as an argument).
template <class C>
concept kbn_rms_norm_has_weight = requires(C& c) { static_cast<Tensor&>(c.weight); };
static_assert(kbn_rms_norm_has_weight<RMSNorm>,
              "L1/rms_norm.h: class 'RMSNorm' must keep its public `Tensor weight` as the baseline declares it "
              "(norm_rope_qkv passes it to fused_qk_norm_rope)");

namespace {

std::vector<BenchCase> norm_cases(const std::string& op, const ModelView& m, const CaseOptions& o) {
  const bool fused = op == "fused_add_rms_norm";
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base(op, m, T, dt);
    b.label = "T=" + cases::str(T) + " H=" + cases::str(H);
    b.args.values = {{"hidden_size", double(H)}, {"eps", m.rms_norm_eps}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      std::vector<Tensor> in{cases::normal({T, H}, dt, d, seed, "x", 1.0)};
      if (fused) in.push_back(cases::normal({T, H}, dt, d, seed, "residual", 1.0));
      return in;
    };
    // x [T, H] (+ residual [T, H]) read, out (fused: x and residual) written, weight [H] read once.
    const int64_t buffers = fused ? 4 : 2;
    b.bytes = buffers * T * H * es + H * es;
    b.flops = (fused ? 5 : 4) * T * H;
    b.input_bytes = (fused ? 2 : 1) * T * H * es;
    b.output_numel = (fused ? 2 : 1) * T * H;
    out.push_back(std::move(b));
  }
  if (fused || !m.has_feature("qk_norm") || !m.attention) return out;
  // Per-head q and k norms (Qwen3): x is q or k viewed inside the fused qkv output [T, (Hq + 2 Hk) * D] (token
  // stride the qkv row, no copy), normalised head by head into a new [T, heads, D].
  const int64_t D = m.attention->head_dim, Hq = m.attention->num_heads, Hk = m.attention->num_kv_heads;
  const int64_t width = (Hq + 2 * Hk) * D;
  for (int64_t T : cases::token_counts(o)) {
    for (const bool is_q : {true, false}) {
      const int64_t heads = is_q ? Hq : Hk, offset = is_q ? 0 : Hq * D;
      BenchCase b = cases::base(op, m, T, dt);
      b.label = std::string(is_q ? "q" : "k") + " heads T=" + cases::str(T) + " heads=" + cases::str(heads) +
                " D=" + cases::str(D) + " row=" + cases::str(width);
      b.args.values = {{"hidden_size", double(D)}, {"eps", m.rms_norm_eps}};
      b.make_inputs = [=](Device d, uint64_t seed) {
        Tensor qkv = cases::normal({T, width}, dt, d, seed, "qkv", 1.0);
        return std::vector<Tensor>{qkv.as_strided({T, heads, D}, {width, D, 1}, qkv.offset() + offset)};
      };
      b.bytes = 2 * T * heads * D * es + D * es;  // the heads read in place, the new tensor written, the weight
      b.flops = 4 * T * heads * D;
      b.input_bytes = T * width * es;
      b.output_numel = T * heads * D;
      out.push_back(std::move(b));
    }
  }
  return out;
}

auto make_norm(const OpArgs& a) { return std::make_unique<RMSNorm>(a.get_int("hidden_size"), a.get("eps"), a.opts); }

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "rms_norm",
         .class_name = "RMSNorm",
         .level = 1,
         .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"},
         .args = {"x"},
         .mutates = {},
         .make = adapter("rms_norm", 1, make_norm,
                         [](RMSNorm& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"rms_norm"},
         .cases = [](const ModelView& m, const CaseOptions& o) { return norm_cases("rms_norm", m, o); }});
  r.add({.name = "fused_add_rms_norm",
         .class_name = "RMSNorm",
         .level = 1,
         .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"},
         .args = {"x", "residual"},
         .mutates = {"x", "residual"},
         .make = adapter("fused_add_rms_norm", 2, make_norm,
                         [](RMSNorm& op, const Tensors& t) {
                           auto [x, res] = op.forward(t[0], t[1]);
                           return Tensors{x, res};
                         }),
         .cases = [](const ModelView& m, const CaseOptions& o) { return norm_cases("fused_add_rms_norm", m, o); }});
}

}  // namespace kbn::KBN_VARIANT
