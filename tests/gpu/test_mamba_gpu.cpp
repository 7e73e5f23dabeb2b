// GPU tests of Mamba-2's conv, state-update and gated-norm L1 ops (causal_conv1d_fn, causal_conv1d_update,
// selective_state_update, mixer2_rms_norm_gated): each on CUDA tensors against the same op on CPU tensors (the
// kbn::reference oracle), on shapes that reach every kernel path: x, B, C, dt and gate as strided views of a wider
// projection row (aligned: 16-byte vectors; odd: the scalar path), batch 1, sequences of 1 and 2 tokens next to ones
// spanning many of the conv's tiles, more sequences than fit in shared memory, widths 2..4, f32/f16/bf16 activations
// and states, and the model's shapes (Mamba-Codestral-7B: 128 heads x 64 x 128, conv_dim 10240, groups of 1024).
// State rows no index lists must keep their bytes; an index outside the cache is a device error naming the argument.
//
// Tolerance: bench::default_tolerance of the output's dtype (two ulps); conv states are copies of inputs and compare
// exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "L1/causal_conv1d_fn.h"
#include "L1/causal_conv1d_update.h"
#include "L1/mixer2_rms_norm_gated.h"
#include "L1/selective_state_update.h"
#include "bench/validate.h"
#include "kbn/compare.h"
#include "kbn/device.h"
#include "kbn/device_errors.h"
#include "kbn/error.h"
#include "kbn/op_case.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"
#include "mamba_contract.h"
#include "op_contract.h"

using namespace kbn;
using namespace kbn::baseline;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

const Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

Tensor randn(const Shape& shape, uint64_t seed, double std = 1.0, DType dt = DType::f32, double mean = 0.0) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_normal_(t, seed, mean, std);
  return dt == DType::f32 ? t : t.to(dt);
}

Tensor i32(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {int64_t(v.size())}); }

void expect_close(const Tensor& actual, const Tensor& expected, DType dt, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const CompareStats s = compare_close(actual.to(kCpu), expected.to(kCpu), bench::default_tolerance(dt));
  EXPECT_EQ(s.bad, 0) << what << ": " << s.describe();
  EXPECT_EQ(s.nan_actual, 0) << what;
}

void expect_bitwise(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  int64_t first = -1;
  const int64_t n = count_bitwise_mismatches(actual.to(kCpu).contiguous(), expected.to(kCpu).contiguous(), &first);
  EXPECT_EQ(n, 0) << what << ": first difference at flat index " << first;
}

// A [rows, cols] tensor placed at column `left` of a wider [rows, left + cols + right] buffer of noise, on `d`: the
// view the ops get from a projection's output. Returns the view.
Tensor in_wider_row(const Tensor& t, int64_t left, int64_t right, Device d, uint64_t seed) {
  const int64_t rows = t.size(0), cols = t.size(1);
  Tensor big = randn({rows, left + cols + right}, seed, 1.0, t.dtype());
  big.slice(1, left, left + cols).copy_(t);
  return big.to(d).slice(1, left, left + cols);
}

// Slots a step's sequences use: the first n of a seeded permutation of [0, num_slots).
Tensor slots_for(int64_t n, int64_t num_slots, uint64_t seed) {
  return cases::permutation_prefix(num_slots, {n}, DType::i32, kCpu, seed, "slots");
}

// The slots of `indices` as a set over [0, num_slots).
std::vector<bool> listed(const Tensor& indices, int64_t num_slots) {
  std::vector<bool> used(size_t(num_slots), false);
  for (int64_t v : indices.to_ints()) used[size_t(v)] = true;
  return used;
}

void expect_unlisted_untouched(const Tensor& after, const Tensor& before, const Tensor& indices, const std::string& w) {
  const std::vector<bool> used = listed(indices, before.size(0));
  const Tensor a = after.to(kCpu);
  for (int64_t s = 0; s < before.size(0); ++s)
    if (!used[size_t(s)])
      expect_bitwise(a.slice(0, s, s + 1), before.slice(0, s, s + 1), w + " slot " + std::to_string(s));
}

// Expects check_device_errors() to raise a message containing `part` (after a synchronisation).
void expect_device_error(const std::string& part) {
  synchronize(kGpu);
  try {
    check_device_errors();
    ADD_FAILURE() << "no device error recorded; expected one containing \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_device_errors());
}

// ---- causal_conv1d_fn ----

struct ConvFnCase {
  std::vector<int32_t> lens;
  int64_t dim, width;
  int64_t left, right;  // the x view's place in its row (0, 0: contiguous)
  bool bias;
  DType dt;
};

std::string describe(const ConvFnCase& c) {
  std::string s = "seqs=" + std::to_string(c.lens.size()) + " [";
  for (size_t i = 0; i < c.lens.size() && i < 8; ++i) s += (i ? " " : "") + std::to_string(c.lens[i]);
  return s + (c.lens.size() > 8 ? " ...]" : "]") + " dim=" + std::to_string(c.dim) +
         " width=" + std::to_string(c.width) + " row=" + std::to_string(c.left + c.dim + c.right) +
         (c.bias ? "" : " no-bias") + " " + dtype_name(c.dt);
}

void run_conv_fn_case(const ConvFnCase& c, uint64_t seed) {
  const std::string what = describe(c);
  std::vector<int32_t> q{0};
  for (int32_t l : c.lens) q.push_back(q.back() + l);
  const int64_t T = q.back(), seqs = int64_t(c.lens.size()), slots = seqs + 3, W = c.width;
  const Tensor x = randn({T, c.dim}, seed, 1.0, c.dt);
  const Tensor weight = randn({c.dim, W}, seed + 1, 0.5, c.dt);
  const Tensor bias = c.bias ? randn({c.dim}, seed + 2, 0.5, c.dt) : Tensor();
  std::vector<int32_t> has(static_cast<size_t>(seqs));
  for (int64_t s = 0; s < seqs; ++s) has[size_t(s)] = s % 3 == 1 ? 0 : 1;
  const Tensor idx = slots_for(seqs, slots, seed + 3);
  // A sequence without an initial state finds NaN in its slot: it must not read it.
  Tensor states = randn({slots, W - 1, c.dim}, seed + 4, 1.0, c.dt);
  const std::vector<int64_t> slot_of = idx.to_ints();
  for (int64_t s = 0; s < seqs; ++s)
    if (!has[size_t(s)]) states.slice(0, slot_of[size_t(s)], slot_of[size_t(s)] + 1).fill_(NAN);
  const Tensor before = states.clone();

  CausalConv1dFn op;
  Tensor cpu_states = states.clone();
  const Tensor want = op.forward(x, weight, bias, cpu_states, i32(has), idx, i32(q));
  Tensor gpu_states = states.to(kGpu);
  const Tensor got =
      op.forward(in_wider_row(x, c.left, c.right, kGpu, seed + 5), weight.to(kGpu), c.bias ? bias.to(kGpu) : Tensor(),
                 gpu_states, i32(has).to(kGpu), idx.to(kGpu), i32(q).to(kGpu));
  expect_close(got, want, c.dt, what + " out");
  expect_bitwise(gpu_states, cpu_states, what + " conv_states");
  expect_unlisted_untouched(gpu_states, before, idx, what);
  EXPECT_NO_THROW(check_device_errors()) << what;
}

TEST(CausalConv1dFnGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  const int64_t codestral_dim = 8192 + 2 * 8 * 128, codestral_row = 8192 + codestral_dim + 128;
  const std::vector<ConvFnCase> cs = {
      {{1}, 64, 4, 0, 0, true, DType::bf16},              // one token
      {{2}, 64, 4, 0, 0, true, DType::f32},               // two tokens
      {{1, 2, 1, 2}, 192, 4, 128, 8, true, DType::bf16},  // all shorter than the window
      {{1, 2, 300, 5, 2, 129, 1}, codestral_dim, 4, 8192, codestral_row - 8192 - codestral_dim, true, DType::bf16},
      {{3000, 1, 2, 77}, 192, 4, 128, 8, true, DType::bf16},  // one sequence over many tiles
      {{4, 1, 17, 3}, 37, 3, 3, 5, true, DType::bf16},        // odd: the scalar path
      {{1, 1, 1, 50, 9}, 40, 2, 0, 0, false, DType::f32},     // width 2, no bias
      {{65, 64, 63, 1, 2, 3}, 96, 4, 0, 0, true, DType::f16},
      {{7, 9, 11}, 128, 4, 4, 4, true, DType::f32},  // f32 rows 16-byte aligned at 4
  };
  uint64_t seed = 100;
  for (const ConvFnCase& c : cs) run_conv_fn_case(c, seed += 10);
}

TEST(CausalConv1dFnGpu, MoreSequencesThanSharedMemoryHolds) {
  KBN_SKIP_WITHOUT_GPU();
  // 13000 sequences: query_start_loc (52 KB) no longer fits the kernel's 48 KB of shared memory and is searched in
  // global memory.
  ConvFnCase c{std::vector<int32_t>(13000), 16, 4, 0, 0, true, DType::bf16};
  for (size_t i = 0; i < c.lens.size(); ++i) c.lens[i] = int32_t(1 + i % 3);
  run_conv_fn_case(c, 7);
}

TEST(CausalConv1dFnGpu, ReportsBadSlotsAndBoundaries) {
  KBN_SKIP_WITHOUT_GPU();
  const Tensor x = randn({6, 32}, 1, 1.0, DType::bf16).to(kGpu), w = randn({32, 4}, 2, 0.5, DType::bf16).to(kGpu);
  Tensor states = randn({3, 3, 32}, 3, 1.0, DType::bf16).to(kGpu);
  CausalConv1dFn op;
  (void)op.forward(x, w, Tensor(), states, i32({1, 1}).to(kGpu), i32({0, 3}).to(kGpu), i32({0, 2, 6}).to(kGpu));
  expect_device_error("'cache_indices'[1]");
  (void)op.forward(x, w, Tensor(), states, i32({1, 1}).to(kGpu), i32({0, 1}).to(kGpu), i32({0, 4, 5}).to(kGpu));
  expect_device_error("'query_start_loc' entry 2");
}

// ---- causal_conv1d_update ----

TEST(CausalConv1dUpdateGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t batch, dim, width, left, right;
    bool bias;
    DType dt;
  };
  const int64_t cd = 8192 + 2 * 8 * 128;
  const std::vector<Case> cs = {{1, cd, 4, 8192, 128, true, DType::bf16}, {256, cd, 4, 8192, 128, true, DType::bf16},
                                {37, 192, 4, 128, 8, true, DType::f32},   {3, 37, 3, 3, 2, true, DType::bf16},
                                {5, 40, 2, 0, 0, false, DType::f16},      {64, 1000, 4, 0, 0, true, DType::bf16},
                                {2, 16, 4, 1, 0, true, DType::f32}};
  uint64_t seed = 300;
  for (const Case& c : cs) {
    seed += 10;
    const std::string what = "B=" + std::to_string(c.batch) + " dim=" + std::to_string(c.dim) +
                             " width=" + std::to_string(c.width) + " " + dtype_name(c.dt);
    const int64_t slots = c.batch + 3;
    const Tensor x = randn({c.batch, c.dim}, seed, 1.0, c.dt);
    const Tensor weight = randn({c.dim, c.width}, seed + 1, 0.5, c.dt);
    const Tensor bias = c.bias ? randn({c.dim}, seed + 2, 0.5, c.dt) : Tensor();
    const Tensor states = randn({slots, c.width - 1, c.dim}, seed + 3, 1.0, c.dt);
    const Tensor idx = slots_for(c.batch, slots, seed + 4);
    CausalConv1dUpdate op;
    Tensor cpu_states = states.clone();
    const Tensor want = op.forward(x, cpu_states, weight, bias, idx);
    Tensor gpu_states = states.to(kGpu);
    const Tensor got = op.forward(in_wider_row(x, c.left, c.right, kGpu, seed + 5), gpu_states, weight.to(kGpu),
                                  c.bias ? bias.to(kGpu) : Tensor(), idx.to(kGpu));
    expect_close(got, want, c.dt, what + " out");
    expect_bitwise(gpu_states, cpu_states, what + " conv_states");
    expect_unlisted_untouched(gpu_states, states, idx, what);
  }
  EXPECT_NO_THROW(check_device_errors());
}

TEST(CausalConv1dUpdateGpu, ReportsASlotOutsideTheCache) {
  KBN_SKIP_WITHOUT_GPU();
  Tensor states = randn({2, 3, 32}, 3, 1.0, DType::bf16).to(kGpu);
  (void)CausalConv1dUpdate().forward(randn({2, 32}, 1, 1.0, DType::bf16).to(kGpu), states,
                                     randn({32, 4}, 2, 0.5, DType::bf16).to(kGpu), Tensor(), i32({0, 2}).to(kGpu));
  expect_device_error("'conv_state_indices'[1]");
}

// ---- selective_state_update ----

struct SsuCase {
  int64_t batch, heads, head_dim, state_size, groups;
  DType dt, state_dt;
  int64_t pad;  // extra elements at the end of the activation row (odd: B and C lose 16-byte alignment)
  bool skip_and_bias = true, softplus = true;
  double dt_max = INFINITY;
};

void run_ssu_case(const SsuCase& c, uint64_t seed) {
  const std::string what =
      "B=" + std::to_string(c.batch) + " heads=" + std::to_string(c.heads) + " P=" + std::to_string(c.head_dim) +
      " N=" + std::to_string(c.state_size) + " groups=" + std::to_string(c.groups) + " x " + dtype_name(c.dt) +
      " state " + dtype_name(c.state_dt) + " pad=" + std::to_string(c.pad) + (c.skip_and_bias ? "" : " no-D/dt_bias") +
      (c.softplus ? "" : " no-softplus") + " dt_max=" + std::to_string(c.dt_max);
  const int64_t nh = c.heads, P = c.head_dim, N = c.state_size, G = c.groups, Bt = c.batch, slots = Bt + 2;
  const int64_t xs = nh * P, gs = G * N, row = xs + nh + 2 * gs + c.pad;
  const Tensor x = randn({Bt, nh, P}, seed, 1.0, c.dt);
  const Tensor dt = randn({Bt, nh}, seed + 1, 1.0, c.dt);
  const Tensor B = randn({Bt, G, N}, seed + 2, 1.0, c.dt);
  const Tensor C = randn({Bt, G, N}, seed + 3, 1.0, c.dt);
  Tensor A = Tensor::empty({nh}, DType::f32);
  fill_uniform_(A, seed + 4, -8.0, -0.5);
  const Tensor D = c.skip_and_bias ? randn({nh}, seed + 5) : Tensor();
  const Tensor dt_bias = c.skip_and_bias ? randn({nh}, seed + 6, 0.5, DType::f32, -1.0) : Tensor();
  const Tensor state = randn({slots, nh, P, N}, seed + 7, 1.0, c.state_dt);
  const Tensor idx = slots_for(Bt, slots, seed + 8);
  // On the GPU, x, dt, B and C are views of one activation row [x | dt | B | C | pad].
  Tensor act = randn({Bt, row}, seed + 9, 1.0, c.dt);
  act.as_strided({Bt, nh, P}, {row, P, 1}, 0).copy_(x);
  act.as_strided({Bt, nh}, {row, 1}, xs).copy_(dt);
  act.as_strided({Bt, G, N}, {row, N, 1}, xs + nh).copy_(B);
  act.as_strided({Bt, G, N}, {row, N, 1}, xs + nh + gs).copy_(C);
  const Tensor g = act.to(kGpu);
  auto gpu = [](const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); };

  SelectiveStateUpdate op(c.softplus, 0.0, c.dt_max);
  Tensor cpu_state = state.clone();
  const Tensor want = op.forward(cpu_state, x, dt, A, B, C, D, dt_bias, idx);
  Tensor gpu_state = state.to(kGpu);
  const Tensor got =
      op.forward(gpu_state, g.as_strided({Bt, nh, P}, {row, P, 1}, 0), g.as_strided({Bt, nh}, {row, 1}, xs), A.to(kGpu),
                 g.as_strided({Bt, G, N}, {row, N, 1}, xs + nh), g.as_strided({Bt, G, N}, {row, N, 1}, xs + nh + gs),
                 gpu(D), gpu(dt_bias), idx.to(kGpu));
  expect_close(got, want, c.dt, what + " out");
  expect_close(gpu_state, cpu_state, c.state_dt, what + " state");
  expect_unlisted_untouched(gpu_state, state, idx, what);
  EXPECT_NO_THROW(check_device_errors()) << what;
}

TEST(SelectiveStateUpdateGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  const std::vector<SsuCase> cs = {
      {1, 128, 64, 128, 8, DType::bf16, DType::bf16, 0},  // Mamba-Codestral, batch 1
      {3, 128, 64, 128, 8, DType::bf16, DType::f32, 0},   // fp32 state cache
      {2, 128, 64, 128, 8, DType::f32, DType::bf16, 0},   // bf16 state, f32 activations (32-byte B/C chunks)
      {37, 8, 16, 16, 2, DType::f32, DType::f32, 0},      // tiny-mamba2
      {256, 8, 16, 16, 2, DType::bf16, DType::bf16, 0},   // a full decode batch
      {3, 6, 5, 24, 3, DType::bf16, DType::bf16, 1},      // odd row: B and C unaligned, the scalar path
      {4, 4, 3, 20, 1, DType::f16, DType::f16, 0},        // state_size not a multiple of 8
      {2, 4, 7, 256, 2, DType::bf16, DType::bf16, 0},     // 32 lanes per row
      {2, 4, 7, 512, 4, DType::bf16, DType::f32, 0},      // several chunks per lane
      {5, 8, 16, 16, 4, DType::bf16, DType::bf16, 0, false, false, 0.05},  // no D/dt_bias, no softplus, clamped
      {5, 8, 16, 16, 4, DType::f32, DType::f32, 0, true, true, 0.1},       // softplus, clamped
  };
  uint64_t seed = 500;
  for (const SsuCase& c : cs) run_ssu_case(c, seed += 20);
}

TEST(SelectiveStateUpdateGpu, ReportsASlotOutsideTheCache) {
  KBN_SKIP_WITHOUT_GPU();
  Tensor state = randn({2, 2, 4, 16}, 1, 1.0, DType::bf16).to(kGpu);
  const Tensor bc = randn({1, 1, 16}, 2, 1.0, DType::bf16).to(kGpu);
  (void)SelectiveStateUpdate().forward(
      state, randn({1, 2, 4}, 3, 1.0, DType::bf16).to(kGpu), randn({1, 2}, 4, 1.0, DType::bf16).to(kGpu),
      Tensor::full({2}, -1.0, DType::f32, kGpu), bc, bc, Tensor(), Tensor(), i32({-2}).to(kGpu));
  expect_device_error("'state_batch_indices'[0]");
}

// -1 (kPadStateSlot) is a padding row of a CUDA-graph batch: zero output, every state untouched, no error.
TEST(SelectiveStateUpdateGpu, PaddingRowsTouchNoState) {
  KBN_SKIP_WITHOUT_GPU();
  Tensor state = randn({2, 2, 4, 16}, 1, 1.0, DType::bf16).to(kGpu);
  const Tensor before = state.to(kCpu);
  const Tensor bc = randn({2, 1, 16}, 2, 1.0, DType::bf16).to(kGpu);
  const Tensor out = SelectiveStateUpdate().forward(
      state, randn({2, 2, 4}, 3, 1.0, DType::bf16).to(kGpu), randn({2, 2}, 4, 1.0, DType::bf16).to(kGpu),
      Tensor::full({2}, -1.0, DType::f32, kGpu), bc, bc, Tensor(), Tensor(), i32({-1, 1}).to(kGpu));
  synchronize(kGpu);
  EXPECT_NO_THROW(check_device_errors());
  for (double v : out.to(kCpu).slice(0, 0, 1).to_doubles()) EXPECT_EQ(v, 0.0);
  expect_bitwise(state.to(kCpu).slice(0, 0, 1), before.slice(0, 0, 1), "slot 0 (no row lists it)");
  Tensor conv = randn({2, 3, 32}, 5, 1.0, DType::bf16).to(kGpu);
  const Tensor conv_before = conv.to(kCpu);
  const Tensor cout = CausalConv1dUpdate().forward(randn({2, 32}, 6, 1.0, DType::bf16).to(kGpu), conv,
                                                   randn({32, 4}, 7, 0.5, DType::bf16).to(kGpu), Tensor(),
                                                   i32({1, -1}).to(kGpu));
  synchronize(kGpu);
  EXPECT_NO_THROW(check_device_errors());
  for (double v : cout.to(kCpu).slice(0, 1, 2).to_doubles()) EXPECT_EQ(v, 0.0);
  expect_bitwise(conv.to(kCpu).slice(0, 0, 1), conv_before.slice(0, 0, 1), "conv slot 0 (no row lists it)");
}

// ---- mixer2_rms_norm_gated ----

TEST(Mixer2RmsNormGatedGpu, MatchesTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, hidden, groups, gate_left, gate_right;
    DType dt;
  };
  const std::vector<Case> cs = {
      {1, 8192, 8, 0, 10368, DType::bf16},   // Mamba-Codestral decode: groups of 1024, one CTA per group
      {300, 8192, 8, 0, 10368, DType::f32},  // 256 f32 vectors per group: 8 per thread
      {7, 4096, 1, 0, 0, DType::bf16},       // one group of 512 vectors: rows over two warps
      {37, 128, 2, 0, 200, DType::bf16},     // tiny-mamba2: groups of 64
      {5, 108, 3, 3, 1, DType::f16},         // groups of 36: the scalar path
      {3, 32768, 2, 0, 0, DType::bf16},      // groups of 16384: the wide kernel
      {2, 3000, 2, 1, 0, DType::f32},        // unaligned groups of 1500: the wide kernel
  };
  uint64_t seed = 700;
  for (const Case& c : cs) {
    seed += 10;
    const std::string what = "T=" + std::to_string(c.tokens) + " hidden=" + std::to_string(c.hidden) +
                             " groups=" + std::to_string(c.groups) + " " + dtype_name(c.dt);
    Mixer2RMSNormGated cpu(c.hidden, c.groups, 1e-5, {c.dt, kCpu});
    Mixer2RMSNormGated gpu(c.hidden, c.groups, 1e-5, {c.dt, kGpu});
    const Tensor w = randn({c.hidden}, seed, 1.0, c.dt);
    cpu.weight.copy_(w);
    gpu.weight.copy_(w.to(kGpu));
    const Tensor x = randn({c.tokens, c.hidden}, seed + 1, 1.0, c.dt);
    const Tensor gate = randn({c.tokens, c.hidden}, seed + 2, 2.0, c.dt);
    const Tensor want = cpu.forward(x, gate);
    const Tensor got = gpu.forward(x.to(kGpu), in_wider_row(gate, c.gate_left, c.gate_right, kGpu, seed + 3));
    expect_close(got, want, c.dt, what);
  }
}

// ---- the validation contract on the GPU ----

// Mamba-Codestral's shapes at decode and prefill token counts (the generic GPU contract runs the tiny models only), and
// the odd Mamba-2 shapes of tests/mamba_contract.h.
TEST(MambaOpsContractGpu, MambaCodestralShapes) {
  KBN_SKIP_WITHOUT_GPU();
  for (const std::string& op : kbn::test::mamba_decode_and_conv_ops())
    kbn::test::check_op_contract({"mamba-codestral-7b-v0.1", op}, kGpu, {1, 37, 256, 600}, 0, DType::bf16);
}

TEST(MambaOpsContractGpu, OddShapes) {
  KBN_SKIP_WITHOUT_GPU();
  for (const char* which : {"odd", "aligned"})
    for (const std::string& op : kbn::test::mamba_decode_and_conv_ops())
      kbn::test::check_op_contract_on_view(op, kbn::test::mamba_view(which), kGpu, {1, 2, 37, 300});
}

}  // namespace
