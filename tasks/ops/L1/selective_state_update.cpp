// selective_state_update: class SelectiveStateUpdate (tasks/baseline/L1/selective_state_update.h), Mamba-2's SSM state
// update for one token per sequence (vLLM selective_state_update, decode); oracle reference::selective_state_update
// (tasks/reference/mamba.cpp).
#include <algorithm>
#include <cmath>

#include "L1/selective_state_update.h"
#include "kbn/rng.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(SelectiveStateUpdate)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(SelectiveStateUpdate, "L1/selective_state_update.h");
KBN_REQUIRE_CTOR(SelectiveStateUpdate, "L1/selective_state_update.h", bool, double, double);
KBN_REQUIRE_METHOD(SelectiveStateUpdate, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&),
                   "L1/selective_state_update.h");

namespace {

Tensor filled(const Shape& shape, Device d, uint64_t seed, const char* name, bool normal, double a, double b) {
  Tensor t = Tensor::empty(shape, DType::f32, d);
  if (normal)
    fill_normal_(t, hash_seed(seed, name), a, b);
  else
    fill_uniform_(t, hash_seed(seed, name), a, b);
  return t;
}

// A decode step: one token per sequence, the states of a cache with a few slots to spare (bf16 states at the default
// dtype: 2 MiB per sequence at Mamba-Codestral's 128 heads x 64 x 128). A, D and dt_bias are drawn like a trained
// model's: A = -exp(A_log) in [-8, -0.5], dt_bias around -2 (time steps of softplus(dt + dt_bias) ~ 0.03..0.5).
std::vector<BenchCase> selective_state_update_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mamba) return {};
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), nh = s.num_heads, P = s.head_dim, N = s.state_size, G = s.n_groups;
  const int64_t cd = s.conv_dim(), I = s.intermediate_size, row = cd + nh;
  // The config's time_step_limit (vLLM's dt_limit); (0, inf) is no clamp.
  const std::vector<double> limit = m.config ? m.config->get_double_list("time_step_limit") : std::vector<double>{};
  const double dt_min = limit.size() == 2 ? limit[0] : 0.0, dt_max = limit.size() == 2 ? limit[1] : INFINITY;
  const std::vector<int64_t> batches = o.tokens.empty() ? cases::decode_token_counts() : o.tokens;
  std::vector<BenchCase> out;
  for (int64_t batch : batches) {
    // CPU-sized cases (o.small) hold at most 4 Mi state values: 4 sequences of Mamba-Codestral, any batch of tiny
    // models.
    const int64_t B =
        o.small ? std::max<int64_t>(1, std::min<int64_t>(batch, (int64_t(1) << 22) / (nh * P * N))) : batch;
    const int64_t slots = B + 3;
    BenchCase b = cases::base("selective_state_update", m, B, dt);
    b.label = "B=" + cases::str(B) + " heads=" + cases::str(nh) + " P=" + cases::str(P) + " N=" + cases::str(N) +
              " groups=" + cases::str(G);
    b.args.values = {{"dt_softplus", 1.0}, {"dt_min", dt_min}};
    if (std::isfinite(dt_max)) b.args.values["dt_max"] = dt_max;
    b.make_inputs = [=](Device d, uint64_t seed) {
      // x, B and C are views of the conv output and dt of the in_proj output in MambaMixer2; here all four are views
      // of one [B, conv_dim + heads] tensor (token stride conv_dim + heads, inner dimensions packed).
      Tensor act = cases::normal({B, row}, dt, d, seed, "activations", 1.0);
      const int64_t off = act.offset();
      return std::vector<Tensor>{cases::normal({slots, nh, P, N}, dt, d, seed, "state", 1.0),
                                 act.as_strided({B, nh, P}, {row, P, 1}, off),
                                 act.as_strided({B, nh}, {row, 1}, off + cd),
                                 filled({nh}, d, seed, "A", false, -8.0, -0.5),
                                 act.as_strided({B, G, N}, {row, N, 1}, off + I),
                                 act.as_strided({B, G, N}, {row, N, 1}, off + I + G * N),
                                 filled({nh}, d, seed, "D", true, 0.0, 1.0),
                                 filled({nh}, d, seed, "dt_bias", true, -2.0, 0.5),
                                 cases::permutation_prefix(slots, {B}, DType::i32, d, seed, "state_batch_indices")};
    };
    // Each sequence's state rows read and written once; x, dt, B, C read, out written; A, D, dt_bias and indices.
    b.bytes = 2 * B * nh * P * N * es + 2 * B * nh * P * es + B * nh * es + 2 * B * G * N * es + 3 * nh * 4 + B * 4;
    b.flops = 5 * B * nh * P * N;  // per state value: decay, the B term, the C dot product
    b.input_bytes = slots * nh * P * N * es + B * row * es + 3 * nh * 4 + B * 4;
    b.output_numel = B * nh * P + slots * nh * P * N;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "selective_state_update",
         .class_name = "SelectiveStateUpdate",
         .level = 1,
         .header = "L1/selective_state_update.h",
         .ctor_args = {"dt_softplus", "dt_min", "dt_max (optional)"},
         .args = {"state", "x", "dt", "A", "B", "C", "D", "dt_bias", "state_batch_indices"},
         .mutates = {"state"},
         .make = adapter(
             "selective_state_update", 9,
             [](const OpArgs& a) {
               return std::make_unique<SelectiveStateUpdate>(a.get("dt_softplus", 1.0) != 0, a.get("dt_min", 0.0),
                                                             a.get("dt_max", INFINITY));
             },
             [](SelectiveStateUpdate& op, const Tensors& t) {
               Tensor y = op.forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
               return Tensors{y, t[0]};
             }),
         .kernels = {"selective_state_update"},
         .cases = selective_state_update_cases,
         .fixed_inputs = {"A", "dt_bias"}});
}

}  // namespace kbn::KBN_VARIANT
