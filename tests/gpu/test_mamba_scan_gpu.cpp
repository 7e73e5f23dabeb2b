// GPU tests of mamba_chunk_scan_combined: the CUDA op (tensor-core kernels for bf16/f16, SIMT kernels for f32)
// against the same op on CPU tensors (the oracle: the recurrence in double, the slots gathered and scattered around
// it), at the tiny model's shape and Codestral's head and state sizes with few heads, every head_dim x state_size the
// kernels are built for, every chunk size, sequences of 1, L - 1, L, L + 1 and 3L + 5 tokens in one call with mixed
// initial states, the model's strided views of the conv output, f32/f16/bf16 states, the time-step options, decays
// strong enough to underflow, chunked prefill in two calls, the slots no sequence lists, and the errors only the
// device sees.
//
// Tolerance: the op contract's (bench::tolerance_for the op in the activation dtype, or in the state's when coarser):
// bf16 rtol 1.6e-2, f16 2e-3, f32 1e-4, atol = atol_rms * rms(expected) with the op's atol_rms (twice rtol for 16-bit:
// the tensor-core products round their operands, tasks/ops/L1/mamba_chunk_scan_combined.cpp). Failures print the
// max |err|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "L1/mamba_chunk_scan_combined.h"
#include "bench/validate.h"
#include "kbn/allocator.h"
#include "kbn/compare.h"
#include "kbn/device.h"
#include "kbn/device_errors.h"
#include "kbn/error.h"
#include "kbn/registry.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"

using namespace kbn;
using namespace kbn::baseline;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

const Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Dims {
  int64_t H, P, N, G, L;
  std::string label() const {
    return "H=" + std::to_string(H) + " P=" + std::to_string(P) + " N=" + std::to_string(N) +
           " G=" + std::to_string(G) + " L=" + std::to_string(L);
  }
};
const Dims kTiny{8, 16, 16, 2, 8};          // models/tiny-mamba2.json
const Dims kCodestral{4, 64, 128, 2, 256};  // Mamba-Codestral-7B's head_dim, state_size and chunk, 2 heads per group

// The lengths the kernels' edges sit between: one token, a chunk less one, a chunk, a chunk and one, several chunks
// and a partial one.
std::vector<int32_t> edge_lengths(int64_t L) {
  return {1, int32_t(L - 1), int32_t(L), int32_t(L + 1), int32_t(3 * L + 5)};
}

struct Options {
  DType act = DType::bf16, state = DType::bf16;
  bool strided = false;  // x, B, C as views of one [T, H P + 2 G N + 8] buffer and dt a column slice, as the model's
  bool softplus = true;
  double dt_min = 0.0, dt_max = INFINITY;
  double dt_scale = 1.0, a_scale = 1.0, x_scale = 1.0;  // 64, 64, 64: the validator's "large" inputs
  bool no_d = false, no_bias = false;
};

// One step's inputs on one device. The base buffers own the memory of the strided views.
struct Inputs {
  Tensor xbc, dt_wide;
  Tensor x, dt, A, B, C, D, dt_bias, state, has, idx, qsl;
  std::vector<int32_t> starts, slots;
  int64_t tokens() const { return starts.back(); }
};

Tensor host_randn(const Shape& s, uint64_t seed, double std, DType dt) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal_(t, seed, 0.0, std);
  return t.to(dt);
}

Tensor i32(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {int64_t(v.size())}); }

// Views of the packed conv output: x [T, H, P], B and C [T, G, N] (token stride = the buffer's row).
void split_views(Inputs& in, const Dims& d) {
  const int64_t T = in.xbc.size(0), W = in.xbc.size(1), off = in.xbc.offset();
  in.x = in.xbc.as_strided({T, d.H, d.P}, {W, d.P, 1}, off);
  in.B = in.xbc.as_strided({T, d.G, d.N}, {W, d.N, 1}, off + d.H * d.P);
  in.C = in.xbc.as_strided({T, d.G, d.N}, {W, d.N, 1}, off + d.H * d.P + d.G * d.N);
  in.dt = in.dt_wide.slice(1, 2, 2 + d.H);
}

Inputs make_inputs(const Dims& d, const std::vector<int32_t>& lens, const std::vector<int32_t>& has, const Options& o,
                   uint64_t seed) {
  Inputs in;
  in.starts = {0};
  for (int32_t l : lens) in.starts.push_back(in.starts.back() + l);
  const int64_t T = in.tokens(), seqs = int64_t(lens.size()), num_slots = seqs + 2;
  // Slots listed in reverse, so slots 0 and 1 belong to no sequence.
  for (int64_t s = 0; s < seqs; ++s) in.slots.push_back(int32_t(num_slots - 1 - s));
  if (o.strided) {
    in.xbc = host_randn({T, d.H * d.P + 2 * d.G * d.N + 8}, seed, o.x_scale, o.act);
    in.dt_wide = host_randn({T, d.H + 5}, seed + 1, o.dt_scale, o.act);
    split_views(in, d);
  } else {
    in.x = host_randn({T, d.H, d.P}, seed, o.x_scale, o.act);
    in.B = host_randn({T, d.G, d.N}, seed + 2, o.x_scale, o.act);
    in.C = host_randn({T, d.G, d.N}, seed + 3, o.x_scale, o.act);
    in.dt = host_randn({T, d.H}, seed + 1, o.dt_scale, o.act);
  }
  // A = -exp(A_log) in about [-8, -0.4]; dt_bias about the inverse softplus of 0.02 (as the op's facts).
  std::vector<float> a = host_randn({d.H}, seed + 4, 1.0, DType::f32).to_floats();
  for (float& v : a) v = float(-std::exp(0.75 * v) * o.a_scale);
  in.A = Tensor::from_floats(a, {d.H});
  std::vector<float> bias = host_randn({d.H}, seed + 5, 0.5, DType::f32).to_floats();
  for (float& v : bias) v -= 4.0f;
  if (!o.no_bias) in.dt_bias = Tensor::from_floats(bias, {d.H});
  if (!o.no_d) in.D = host_randn({d.H}, seed + 6, 1.0, DType::f32);
  in.state = host_randn({num_slots, d.H, d.P, d.N}, seed + 7, 1.0, o.state);
  in.has = i32(has);
  in.idx = i32(in.slots);
  in.qsl = i32(in.starts);
  return in;
}

Tensor moved(const Tensor& t, Device dev) { return t.defined() ? t.to(dev) : Tensor(); }

// The same inputs on `dev` (the strided views recreated over the copied buffers).
Inputs place(const Inputs& h, const Dims& d, Device dev) {
  Inputs g = h;
  if (h.xbc.defined()) {
    g.xbc = h.xbc.to(dev);
    g.dt_wide = h.dt_wide.to(dev);
    split_views(g, d);
  } else {
    g.x = h.x.to(dev);
    g.B = h.B.to(dev);
    g.C = h.C.to(dev);
    g.dt = h.dt.to(dev);
  }
  for (auto [dst, src] : {std::pair{&g.A, &h.A},
                          {&g.D, &h.D},
                          {&g.dt_bias, &h.dt_bias},
                          {&g.state, &h.state},
                          {&g.has, &h.has},
                          {&g.idx, &h.idx},
                          {&g.qsl, &h.qsl}})
    *dst = moved(*src, dev);
  return g;
}

Tensor run(MambaChunkScanCombined& op, Inputs& in) {
  return op.forward(in.x, in.dt, in.A, in.B, in.C, in.D, in.dt_bias, in.state, in.has, in.idx, in.qsl);
}

// Poisons the caching allocator's free blocks of this size (NaN), so an output element the op forgets to write fails.
void poison_next_output(const Shape& shape, DType dt) {
  const size_t before = cuda_allocator_stats(kGpu.index).num_device_mallocs;
  std::vector<Tensor> held;
  for (int i = 0; i < 64; ++i) {
    held.push_back(Tensor::full(shape, kNaN, dt, kGpu));
    if (cuda_allocator_stats(kGpu.index).num_device_mallocs != before) break;
  }
  synchronize(kGpu);
}

Tolerance op_tolerance(DType dt) {
  return bench::tolerance_for(registry(Variant::baseline).get("mamba_chunk_scan_combined"), dt);
}

Tolerance tolerance(DType a, DType b) {
  const Tolerance ta = op_tolerance(a), tb = op_tolerance(b);
  return ta.rtol >= tb.rtol ? ta : tb;
}

void expect_close(const Tensor& actual, const Tensor& expected, const Tolerance& tol, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const CompareStats s = compare_close(actual.to(kCpu), expected.to(kCpu), tol);
  EXPECT_EQ(s.bad, 0) << what << ": " << s.describe() << " (rtol " << tol.rtol << ", atol_rms " << tol.atol_rms << ")";
  EXPECT_EQ(s.nan_actual, 0) << what;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.to(kCpu).contiguous(), cb = b.to(kCpu).contiguous();
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// The GPU op against the CPU op (the oracle) on the same inputs: outputs, every listed slot's final state, and the
// unlisted slots bit for bit as they were.
void check_against_oracle(const Dims& d, const std::vector<int32_t>& lens, const std::vector<int32_t>& has,
                          const Options& o, uint64_t seed) {
  int64_t tokens = 0;
  for (int32_t l : lens) tokens += l;
  SCOPED_TRACE(d.label() + " act " + dtype_name(o.act) + " state " + dtype_name(o.state) +
               (o.strided ? " strided" : "") + " seqs " + std::to_string(lens.size()) + " tokens " +
               std::to_string(tokens));
  MambaChunkScanCombined op(d.L, o.softplus, o.dt_min, o.dt_max);
  Inputs h = make_inputs(d, lens, has, o, seed);
  Inputs g = place(h, d, kGpu);
  const Tensor before = h.state.clone();
  poison_next_output({h.tokens(), d.H, d.P}, o.act);
  const Tensor y_gpu = run(op, g);
  const Tensor y_cpu = run(op, h);
  const Tolerance tol = tolerance(o.act, o.state);
  expect_close(y_gpu, y_cpu, tol, "out");
  for (size_t s = 0; s < h.slots.size(); ++s)
    expect_close(g.state.select(0, h.slots[s]), h.state.select(0, h.slots[s]), tol,
                 "final state of sequence " + std::to_string(s) + " (slot " + std::to_string(h.slots[s]) + ")");
  for (int64_t slot : {0, 1})
    EXPECT_TRUE(bitwise_equal(g.state.select(0, slot), before.select(0, slot))) << "unlisted slot " << slot;
}

TEST(MambaChunkScanGpu, MatchesTheOracleAtTinyAndCodestralShapes) {
  KBN_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Dims& d : {kTiny, kCodestral})
    for (DType act : {DType::f32, DType::bf16, DType::f16})
      for (bool strided : {false, true}) {
        Options o;
        o.act = o.state = act;
        o.strided = strided;
        check_against_oracle(d, edge_lengths(d.L), {1, 0, 1, 0, 1}, o, seed++);
        // One sequence alone, with and without a state.
        check_against_oracle(d, {int32_t(3 * d.L + 5)}, {strided ? 1 : 0}, o, seed++);
      }
}

TEST(MambaChunkScanGpu, EveryHeadDimAndStateSize) {
  KBN_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int64_t P : {16, 32, 64, 128})
    for (int64_t N : {16, 32, 64, 128})
      for (DType act : {DType::f32, DType::bf16}) {
        Options o;
        o.act = o.state = act;
        check_against_oracle({2, P, N, 1, 64}, {1, 63, 70}, {0, 1, 1}, o, seed++);
      }
}

TEST(MambaChunkScanGpu, EveryChunkSize) {
  KBN_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (int64_t L : {8, 16, 32, 64, 128, 256})
    for (DType act : {DType::f32, DType::bf16}) {
      Options o;
      o.act = o.state = act;
      check_against_oracle({4, 32, 64, 4, L}, edge_lengths(L), {0, 1, 0, 1, 1}, o, seed++);
    }
}

TEST(MambaChunkScanGpu, StateDtypesAndTimeStepOptions) {
  KBN_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> lens = edge_lengths(kTiny.L), has = {1, 1, 0, 1, 0};
  uint64_t seed = 300;
  for (DType act : {DType::f32, DType::bf16})
    for (DType st : {DType::f32, DType::f16, DType::bf16}) {
      Options o;
      o.act = act;
      o.state = st;
      check_against_oracle(kCodestral, edge_lengths(kCodestral.L), has, o, seed++);
    }
  for (DType act : {DType::f32, DType::bf16}) {
    Options clamp;  // vLLM's dt_limit
    clamp.act = clamp.state = act;
    clamp.dt_min = 0.01;
    clamp.dt_max = 0.05;
    check_against_oracle(kTiny, lens, has, clamp, seed++);
    Options raw;  // no softplus: dt + dt_bias clamped at dt_min = 0 (a zero time step: no decay, no input)
    raw.act = raw.state = act;
    raw.softplus = false;
    raw.no_bias = true;
    check_against_oracle(kTiny, lens, has, raw, seed++);
    Options bare;  // D and dt_bias undefined
    bare.act = bare.state = act;
    bare.no_d = bare.no_bias = true;
    check_against_oracle(kCodestral, {5, 300}, {1, 0}, bare, seed++);
  }
}

TEST(MambaChunkScanGpu, StrongDecaysStayFinite) {
  // The validator's "large" inputs (every value x64): time steps of ~100 and A of ~-100 make every decay but the
  // diagonal's underflow to 0; exponents are differences cum_t - cum_u <= 0, so none overflows.
  KBN_SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (const Dims& d : {kTiny, kCodestral})
    for (DType act : {DType::f32, DType::bf16}) {
      Options o;
      o.act = o.state = act;
      o.dt_scale = o.a_scale = o.x_scale = 64;
      check_against_oracle(d, edge_lengths(d.L), {1, 0, 1, 0, 1}, o, seed++);
    }
}

TEST(MambaChunkScanGpu, TwoCallsChainLikeOne) {
  // Chunked prefill: sequence 1 scanned in two calls, the second starting from the first's final state in the same
  // slot, ends with the outputs and state of one call.
  KBN_SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Dims& d : {kTiny, kCodestral})
    for (DType act : {DType::f32, DType::bf16})
      for (int64_t cut : {int64_t(1), d.L - 2, d.L, d.L + 5}) {
        SCOPED_TRACE(d.label() + " " + dtype_name(act) + " cut " + std::to_string(cut));
        Options o;
        o.act = o.state = act;
        const int32_t len0 = int32_t(d.L + 3), len1 = int32_t(2 * d.L + 7);
        const Inputs h = make_inputs(d, {len0, len1}, {1, 1}, o, seed++);
        MambaChunkScanCombined op(d.L);
        Inputs one = place(h, d, kGpu);
        const Tensor y = run(op, one);
        Inputs two = place(h, d, kGpu);
        const int64_t s1 = len0 + cut, end = len0 + len1;
        auto rows = [](const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b); };
        const Tensor ya =
            op.forward(rows(two.x, 0, s1), rows(two.dt, 0, s1), two.A, rows(two.B, 0, s1), rows(two.C, 0, s1), two.D,
                       two.dt_bias, two.state, two.has, two.idx, i32({0, len0, int32_t(s1)}).to(kGpu));
        const Tensor yb = op.forward(rows(two.x, s1, end), rows(two.dt, s1, end), two.A, rows(two.B, s1, end),
                                     rows(two.C, s1, end), two.D, two.dt_bias, two.state, i32({1}).to(kGpu),
                                     i32({h.slots[1]}).to(kGpu), i32({0, int32_t(end - s1)}).to(kGpu));
        const Tolerance tol = op_tolerance(act);
        expect_close(ya, rows(y, 0, s1), tol, "first call's outputs");
        expect_close(yb, rows(y, s1, end), tol, "second call's outputs");
        expect_close(two.state, one.state, tol, "states after two calls");
        // ...and the single call is the oracle's.
        Inputs cpu = h;
        cpu.state = h.state.clone();
        MambaChunkScanCombined ref(d.L);
        expect_close(y, run(ref, cpu), tol, "one call vs the oracle");
      }
}

TEST(MambaChunkScanGpu, IgnoresAFreshSequencesSlotAndLeavesUnlistedSlots) {
  KBN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::f32, DType::bf16}) {
    Options o;
    o.act = o.state = act;
    const std::vector<int32_t> lens = edge_lengths(kCodestral.L), has = {1, 0, 1, 0, 0};
    const Inputs h = make_inputs(kCodestral, lens, has, o, 600);
    MambaChunkScanCombined op(kCodestral.L);
    // NaN in the slots of the sequences without a state (sequences 1, 3 and 4: slots 5, 3 and 2) and in the unlisted
    // slots 0 and 1; zeros in the fresh sequences' slots in the second run.
    Inputs nan_in = place(h, kCodestral, kGpu), zero_in = place(h, kCodestral, kGpu);
    for (size_t s = 0; s < has.size(); ++s)
      if (!has[s]) {
        nan_in.state.select(0, h.slots[s]).fill_(kNaN);
        zero_in.state.select(0, h.slots[s]).zero_();
      }
    for (int64_t slot : {0, 1}) nan_in.state.select(0, slot).fill_(kNaN);
    const Tensor y_nan = run(op, nan_in), y_zero = run(op, zero_in);
    EXPECT_TRUE(bitwise_equal(y_nan, y_zero)) << dtype_name(act) << ": a fresh sequence read its slot";
    for (size_t s = 0; s < has.size(); ++s)
      EXPECT_TRUE(bitwise_equal(nan_in.state.select(0, h.slots[s]), zero_in.state.select(0, h.slots[s])))
          << "sequence " << s;
    for (int64_t slot : {0, 1})
      for (double v : nan_in.state.select(0, slot).to_doubles()) ASSERT_TRUE(std::isnan(v)) << "slot " << slot;
    // Deterministic: the same call twice, bit for bit.
    Inputs again = place(h, kCodestral, kGpu);
    for (size_t s = 0; s < has.size(); ++s)
      if (!has[s]) again.state.select(0, h.slots[s]).zero_();
    EXPECT_TRUE(bitwise_equal(run(op, again), y_zero));
  }
}

TEST(MambaChunkScanGpu, BadSlotsAndBoundariesAreDeviceErrors) {
  KBN_SKIP_WITHOUT_GPU();
  Options o;
  const Inputs h = make_inputs(kTiny, {3, 9}, {1, 0}, o, 700);
  MambaChunkScanCombined op(kTiny.L);
  auto error_after = [&](Inputs g) {
    (void)run(op, g);
    synchronize(kGpu);
    try {
      check_device_errors();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Inputs bad_slot = place(h, kTiny, kGpu);
  bad_slot.idx = i32({h.slots[0], 4}).to(kGpu);  // 4 slots: 0..3
  EXPECT_NE(error_after(bad_slot).find("'state_indices' of sequence 1"), std::string::npos);
  Inputs bad_loc = place(h, kTiny, kGpu);
  bad_loc.qsl = i32({0, 13, 12}).to(kGpu);
  EXPECT_NE(error_after(bad_loc).find("'query_start_loc'"), std::string::npos);
  EXPECT_EQ(error_after(place(h, kTiny, kGpu)), "");
}

}  // namespace
