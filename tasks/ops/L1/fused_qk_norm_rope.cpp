// fused_qk_norm_rope: class FusedQKNormRope (tasks/baseline/L1/fused_qk_norm_rope.h), oracle
// tasks/reference/rotary.cpp (reference::fused_qk_norm_rope: the per-head norm oracle, then the rotary one).
#include <algorithm>

#include "L1/fused_qk_norm_rope.h"
#include "ops/op.h"
#include "reference/reference.h"

KBN_FALLBACK_CLASS(FusedQKNormRope)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FusedQKNormRope, "L1/fused_qk_norm_rope.h");
KBN_REQUIRE_CTOR(FusedQKNormRope, "L1/fused_qk_norm_rope.h", int64_t, int64_t, int64_t, double, double);
KBN_REQUIRE_METHOD(FusedQKNormRope, TensorPair, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&),
                   "L1/fused_qk_norm_rope.h");
// The L2 blocks ask it whether the kernel takes their shapes (else they run the three ops it replaces).
template <class C>
concept kbn_has_kernel_supports = requires { static_cast<bool (*)(DType, int64_t)>(&C::kernel_supports); };
static_assert(kbn_has_kernel_supports<FusedQKNormRope>,
              "L1/fused_qk_norm_rope.h: class 'FusedQKNormRope' must declare `static bool kernel_supports(DType, "
              "int64_t)` exactly as the baseline does");

namespace {

// One rope of the model (Gemma-3's local one too) at every token count: qkv rows as the fused projection writes them,
// the norm weights, and the rope's cos/sin table (positions drawn below a table of at most 8192 rows: the model's
// frequencies, a table the host builds quickly).
void add_cases(std::vector<BenchCase>& out, const ModelView& m, const CaseOptions& o, double base,
               const RopeScaling& scaling, const std::string& tag) {
  const AttentionShape& a = *m.attention;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), D = a.head_dim, Hq = a.num_heads, Hk = a.num_kv_heads;
  const int64_t width = (Hq + 2 * Hk) * D, max_pos = std::min<int64_t>(m.max_position_embeddings, 8192);
  const double offset = m.has_feature("gemma_norm") ? 1.0 : 0.0;
  // The table is built once (its trig on the host costs ~10 ms; the timing modes build many input instances).
  const Tensor table = reference::rope_cos_sin_cache(D, max_pos, base, scaling).to(dt);
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("fused_qk_norm_rope", m, T, dt);
    b.label = "T=" + cases::str(T) + " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) +
              (offset != 0.0 ? " gemma" : "") + tag;
    b.args.values = {{"num_heads", double(Hq)},
                     {"num_kv_heads", double(Hk)},
                     {"head_dim", double(D)},
                     {"eps", m.rms_norm_eps},
                     {"weight_offset", offset}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{
          cases::normal({T, width}, dt, d, seed, "qkv", 1.0), cases::randint({T}, DType::i64, d, seed, "positions", 0, max_pos),
          cases::normal({D}, dt, d, seed, "q_weight", 1.0), cases::normal({D}, dt, d, seed, "k_weight", 1.0),
          table.clone().to(d)};
    };
    // q and k heads read from the qkv rows and written to q and k; both weights; one cos|sin row and position per
    // token.
    b.bytes = 2 * T * (Hq + Hk) * D * es + 2 * D * es + T * D * es + T * 8;
    b.flops = 7 * T * (Hq + Hk) * D;  // norm: square-add, 2 scales; rotation: 2 multiplies, 1 add per feature
    b.input_bytes = T * width * es + T * 8 + 2 * D * es + max_pos * D * es;
    b.output_numel = T * (Hq + Hk) * D;
    out.push_back(std::move(b));
  }
}

std::vector<BenchCase> qk_norm_rope_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (!m.attention || !(m.has_feature("qk_norm") || m.has_feature("gemma_norm"))) return out;
  if (!FusedQKNormRope::kernel_supports(o.dtype, m.attention->head_dim)) return out;
  add_cases(out, m, o, m.attention->rope.theta, m.attention->rope.scaling, "");
  if (m.config && m.config->has("rope_local_base_freq"))  // Gemma-3's sliding layers
    add_cases(out, m, o, m.config->get_double("rope_local_base_freq"), RopeScaling{}, " local");
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "fused_qk_norm_rope",
         .class_name = "FusedQKNormRope",
         .level = 1,
         .header = "L1/fused_qk_norm_rope.h",
         .ctor_args = {"num_heads", "num_kv_heads", "head_dim", "eps", "weight_offset"},
         .args = {"qkv", "positions", "q_weight", "k_weight", "cos_sin_cache"},
         .mutates = {},
         .make = adapter(
             "fused_qk_norm_rope", 5,
             [](const OpArgs& a) {
               return std::make_unique<FusedQKNormRope>(a.get_int("num_heads"), a.get_int("num_kv_heads"),
                                                        a.get_int("head_dim"), a.get("eps"), a.get("weight_offset"));
             },
             [](FusedQKNormRope& op, const Tensors& t) {
               auto [q, k] = op.forward(t[0], t[1], t[2], t[3], t[4]);
               return Tensors{q, k};
             }),
         .kernels = {"fused_qk_norm_rope_kernel"},
         .cases = qk_norm_rope_cases});
}

}  // namespace kbn::KBN_VARIANT
