// causal_conv1d_update: class CausalConv1dUpdate (tasks/baseline/L1/causal_conv1d_update.h), Mamba-2's causal conv for
// one new input per sequence (vLLM causal_conv1d_update, decode); oracle reference::causal_conv1d_update
// (tasks/reference/mamba.cpp).
#include "L1/causal_conv1d_update.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(CausalConv1dUpdate)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(CausalConv1dUpdate, "L1/causal_conv1d_update.h");
KBN_REQUIRE_CTOR(CausalConv1dUpdate, "L1/causal_conv1d_update.h", const std::string&);
KBN_REQUIRE_METHOD(CausalConv1dUpdate, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&),
                   "L1/causal_conv1d_update.h");

namespace {

// A decode step: one new token per sequence, each in its own slot of a state cache with a few slots to spare.
std::vector<BenchCase> causal_conv1d_update_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mamba) return {};
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), I = s.intermediate_size, cd = s.conv_dim(), W = s.conv_kernel;
  const int64_t row = I + cd + s.num_heads;  // in_proj's output row: [z | xBC | dt]
  const bool has_bias = s.conv_bias;
  const std::vector<int64_t> batches = o.tokens.empty() ? cases::decode_token_counts() : o.tokens;
  std::vector<BenchCase> out;
  for (int64_t B : batches) {
    const int64_t slots = B + 3;
    BenchCase b = cases::base("causal_conv1d_update", m, B, dt);
    b.label =
        "B=" + cases::str(B) + " dim=" + cases::str(cd) + " width=" + cases::str(W) + (has_bias ? "" : " no-bias");
    b.args.values = {{"silu", 1.0}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      // x is the xBC columns of the in_proj output, as MambaMixer2 passes it (row stride I + conv_dim + heads).
      Tensor proj = cases::normal({B, row}, dt, d, seed, "in_proj_out", 1.0);
      return std::vector<Tensor>{proj.slice(1, I, I + cd),
                                 cases::normal({slots, W - 1, cd}, dt, d, seed, "conv_states", 1.0),
                                 cases::normal({cd, W}, dt, d, seed, "weight", 0.5),
                                 has_bias ? cases::normal({cd}, dt, d, seed, "bias", 0.5) : Tensor(),
                                 cases::permutation_prefix(slots, {B}, DType::i32, d, seed, "conv_state_indices")};
    };
    const int64_t taps = cd * W * es + (has_bias ? cd * es : 0);
    // x read and out written once, each sequence's state rows read and written once, the taps and indices read.
    b.bytes = 2 * B * cd * es + 2 * B * (W - 1) * cd * es + taps + B * 4;
    b.flops = B * cd * (2 * W + 4);  // the taps' multiply-adds, then silu (exp, add, divide)
    b.input_bytes = B * row * es + slots * (W - 1) * cd * es + taps + B * 4;
    b.output_numel = B * cd + slots * (W - 1) * cd;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add(
      {.name = "causal_conv1d_update",
       .class_name = "CausalConv1dUpdate",
       .level = 1,
       .header = "L1/causal_conv1d_update.h",
       .ctor_args = {"silu"},
       .args = {"x", "conv_states", "weight", "bias", "conv_state_indices"},
       .mutates = {"conv_states"},
       .make = adapter(
           "causal_conv1d_update", 5,
           [](const OpArgs& a) { return std::make_unique<CausalConv1dUpdate>(a.get("silu", 1.0) != 0 ? "silu" : ""); },
           [](CausalConv1dUpdate& op, const Tensors& t) {
             Tensor y = op.forward(t[0], t[1], t[2], t[3], t[4]);
             return Tensors{y, t[1]};
           }),
       .kernels = {"causal_conv1d_update"},
       .cases = causal_conv1d_update_cases});
}

}  // namespace kbn::KBN_VARIANT
