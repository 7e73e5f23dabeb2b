// causal_conv1d_fn: class CausalConv1dFn (tasks/baseline/L1/causal_conv1d_fn.h), Mamba-2's causal depthwise conv over
// a step's prefill sequences (vLLM causal_conv1d_fn, varlen); oracle reference::causal_conv1d_fn
// (tasks/reference/mamba.cpp).
#include <algorithm>

#include "L1/causal_conv1d_fn.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(CausalConv1dFn)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(CausalConv1dFn, "L1/causal_conv1d_fn.h");
KBN_REQUIRE_CTOR(CausalConv1dFn, "L1/causal_conv1d_fn.h", const std::string&);
KBN_REQUIRE_METHOD(CausalConv1dFn, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&),
                   "L1/causal_conv1d_fn.h");

namespace {

// A step's prefill sequences from its token count alone: lengths cycle through 1, 2, 3 + T/5, 7, 1 + T/3 and 37 (the
// last sequence takes what is left), so every case mixes sequences shorter than the conv's window, which carry part
// of their old state into the new one, with sequences spanning many of the kernel's tiles.
std::vector<int32_t> sequence_starts(int64_t T) {
  const std::vector<int64_t> cycle = {1, 2, 3 + T / 5, 7, 1 + T / 3, 37};
  std::vector<int32_t> starts{0};
  for (size_t i = 0; starts.back() < T; ++i)
    starts.push_back(int32_t(std::min<int64_t>(T, starts.back() + cycle[i % cycle.size()])));
  return starts;
}

std::vector<BenchCase> causal_conv1d_fn_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mamba) return {};
  const MambaShape& s = *m.mamba;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), I = s.intermediate_size, cd = s.conv_dim(), W = s.conv_kernel;
  const int64_t row = I + cd + s.num_heads;  // in_proj's output row: [z | xBC | dt]
  const bool has_bias = s.conv_bias;
  const std::vector<int64_t> tokens = o.tokens.empty() ? cases::prefill_token_counts() : o.tokens;
  std::vector<BenchCase> out;
  for (int64_t T : tokens) {
    const std::vector<int32_t> starts = sequence_starts(T);
    const int64_t seqs = int64_t(starts.size()) - 1, slots = seqs + 3;
    BenchCase b = cases::base("causal_conv1d_fn", m, T, dt);
    b.label = "T=" + cases::str(T) + " seqs=" + cases::str(seqs) + " dim=" + cases::str(cd) +
              " width=" + cases::str(W) + (has_bias ? "" : " no-bias");
    b.args.values = {{"silu", 1.0}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      // x is the xBC columns of the in_proj output, as MambaMixer2 passes it (row stride I + conv_dim + heads).
      Tensor proj = cases::normal({T, row}, dt, d, seed, "in_proj_out", 1.0);
      return std::vector<Tensor>{proj.slice(1, I, I + cd),
                                 cases::normal({cd, W}, dt, d, seed, "weight", 0.5),
                                 has_bias ? cases::normal({cd}, dt, d, seed, "bias", 0.5) : Tensor(),
                                 cases::normal({slots, W - 1, cd}, dt, d, seed, "conv_states", 1.0),
                                 cases::randint({seqs}, DType::i32, d, seed, "has_initial_state", 0, 2),
                                 cases::permutation_prefix(slots, {seqs}, DType::i32, d, seed, "cache_indices"),
                                 cases::filled_i32(starts, d)};
    };
    const int64_t metadata = (seqs + 1) * 4 + 2 * seqs * 4;
    const int64_t taps = cd * W * es + (has_bias ? cd * es : 0);
    // x read and out written once, the taps once, each sequence's state rows read and written once.
    b.bytes = 2 * T * cd * es + taps + 2 * seqs * (W - 1) * cd * es + metadata;
    b.flops = T * cd * (2 * W + 4);  // the taps' multiply-adds, then silu (exp, add, divide)
    b.input_bytes = T * row * es + taps + slots * (W - 1) * cd * es + metadata;
    b.output_numel = T * cd + slots * (W - 1) * cd;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "causal_conv1d_fn",
         .class_name = "CausalConv1dFn",
         .level = 1,
         .header = "L1/causal_conv1d_fn.h",
         .ctor_args = {"silu"},
         .args = {"x", "weight", "bias", "conv_states", "has_initial_state", "cache_indices", "query_start_loc"},
         .mutates = {"conv_states"},
         .make = adapter(
             "causal_conv1d_fn", 7,
             [](const OpArgs& a) { return std::make_unique<CausalConv1dFn>(a.get("silu", 1.0) != 0 ? "silu" : ""); },
             [](CausalConv1dFn& op, const Tensors& t) {
               Tensor y = op.forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
               return Tensors{y, t[3]};
             }),
         .kernels = {"causal_conv1d_fn"},
         .cases = causal_conv1d_fn_cases});
}

}  // namespace kbn::KBN_VARIANT
