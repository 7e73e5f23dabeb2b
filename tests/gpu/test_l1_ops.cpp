// GPU tests of the L1 ops: each op on CUDA tensors against the same op on CPU tensors (which runs the
// kbn::reference oracle), over real and odd shapes, strided views, bf16/f16/f32.
//
// Tolerances (|gpu - cpu| <= atol + rtol * |cpu| per element):
//   bf16: rtol 1.6e-2 (2 ulp: bf16 keeps 8 significant bits, 1 ulp <= 2^-7 of the value), atol 1e-5
//   f16:  rtol 2e-3   (2 ulp: 1 ulp <= 2^-10 of the value), atol 1e-5
//   f32:  rtol 1e-5, atol 1e-6
// The GPU computes in fp32 and the oracle in double, so one rounding of the result may differ by an ulp;
// atol covers cancellation (rotary's x*cos - y*sin near zero). linear compares the relative Frobenius
// error instead (bf16 1e-2, f16 2e-3, f32 1e-5). store_kvcache and embedding are copies: bitwise equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "L1/all_reduce.h"
#include "L1/argmax.h"
#include "L1/embedding.h"
#include "L1/fused_qk_norm_rope.h"
#include "L1/fused_rope_kvcache.h"
#include "L1/gelu_and_mul.h"
#include "L1/gemma_rms_norm.h"
#include "L1/linear.h"
#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L1/rotary_embedding.h"
#include "L1/router_gemm.h"
#include "L1/silu_and_mul.h"
#include "L1/store_kvcache.h"
#include "L1/swiglu_oai_and_mul.h"
#include "kbn/allocator.h"
#include "kbn/error.h"
#include "kbn/parallel_state.h"
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
constexpr DType kFloatTypes[] = {DType::bf16, DType::f16, DType::f32};

struct Tol {
  double rtol, atol;
};

Tol elementwise_tol(DType dt) {
  switch (dt) {
    case DType::bf16:
      return {1.6e-2, 1e-5};
    case DType::f16:
      return {2e-3, 1e-5};
    default:
      return {1e-5, 1e-6};
  }
}

// For outputs computed from operands that were themselves rounded to dt on each side (a norm before a rotation): the
// elementwise tolerance plus two units of dt's rounding at the largest expected magnitude.
Tol rounded_operands_tol(DType dt, const Tensor& expected) {
  double max_abs = 0;
  for (double v : expected.to_doubles()) max_abs = std::max(max_abs, std::fabs(v));
  const double unit = dt == DType::bf16 ? 0x1p-8 : dt == DType::f16 ? 0x1p-11 : 0x1p-24;
  Tol t = elementwise_tol(dt);
  t.atol += 4 * unit * max_abs;
  return t;
}

double frobenius_tol(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 1e-2;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-5;
  }
}

// The same values on both devices.
struct Pair {
  Tensor cpu, gpu;
  Pair slice(int64_t d, int64_t start, int64_t end) const {
    return {cpu.slice(d, start, end), gpu.slice(d, start, end)};
  }
};

// N(0, std) values generated on the GPU (fast for large weights) and copied to the host bit for bit.
Pair randn(const Shape& shape, DType dt, uint64_t seed, double std = 1.0) {
  Tensor g = Tensor::empty(shape, dt, kGpu);
  fill_normal_(g, seed, 0.0, std);
  return {g.to(kCpu), g};
}

Pair from_host(const Tensor& cpu) { return {cpu, cpu.to(kGpu)}; }

// A slot mapping for T tokens over num_slots page rows: distinct slots in shuffled order, every fifth token from the
// second a padding token (-1), and from 5 tokens the fifth past the pages (store_kvcache and the fused stores skip it).
std::vector<int64_t> scattered_slots(int64_t num_slots, int64_t T, uint64_t seed) {
  std::vector<int64_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(size_t(T));
  for (size_t t = 1; t < slots.size(); t += 5) slots[t] = -1;
  if (T > 4) slots[4] = num_slots + 3;
  return slots;
}

// A [rows, cols] view with row stride cols + pad and element offset `offset` into a wider random tensor.
Pair strided_randn(int64_t rows, int64_t cols, int64_t pad, int64_t offset, DType dt, uint64_t seed) {
  return randn({rows, cols + pad}, dt, seed).slice(1, offset, offset + cols);
}

// [tokens, heads, head] view at column `column` of a fused [tokens, width] tensor.
Pair qkv_view(const Pair& qkv, const Shape& shape, int64_t column) {
  const Shape strides{qkv.cpu.stride(0), shape[2], 1};
  return {qkv.cpu.as_strided(shape, strides, qkv.cpu.offset() + column),
          qkv.gpu.as_strided(shape, strides, qkv.gpu.offset() + column)};
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(kCpu).contiguous();
  std::vector<uint8_t> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// Poisons the caching allocator's free blocks of this size on the current stream (NaN for floats, -7 for
// integers), so the next output of that size that an op allocates starts poisoned: an element the op
// forgets to write then fails the comparison. Drains every cached block of the size class, so the op
// cannot be handed an unpoisoned one.
void poison_next_output(const Shape& shape, DType dt) {
  const size_t before = cuda_allocator_stats(kGpu.index).num_device_mallocs;
  std::vector<Tensor> held;
  for (int i = 0; i < 64; ++i) {
    held.push_back(Tensor::full(shape, is_floating(dt) ? kNaN : -7.0, dt, kGpu));
    if (cuda_allocator_stats(kGpu.index).num_device_mallocs != before) break;
  }
  synchronize(kGpu);
}

// Every element within tolerance; NaN or inf on either side fails.
void expect_close(const Tensor& gpu, const Tensor& cpu, Tol tol, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_TRUE(gpu.is_cuda()) << what;
  const std::vector<double> a = gpu.to_doubles(), b = cpu.to_doubles();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok =
        std::isfinite(a[i]) && std::isfinite(b[i]) && std::fabs(a[i] - b[i]) <= tol.atol + tol.rtol * std::fabs(b[i]);
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements out of tolerance (rtol " << tol.rtol
                    << ", atol " << tol.atol << "); first at flat index " << first << ": gpu "
                    << (first >= 0 ? a[size_t(first)] : 0) << ", cpu " << (first >= 0 ? b[size_t(first)] : 0);
}

void expect_bitwise_equal(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  const std::vector<uint8_t> a = bytes_of(gpu), b = bytes_of(cpu);
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      first = i;
      break;
    }
  EXPECT_EQ(first, a.size()) << what << ": first differing byte at " << first << " of " << a.size() << " (element "
                             << first / gpu.element_size() << ")";
}

// sqrt(sum (a - b)^2 / sum b^2); +inf when a holds a non-finite value.
double relative_frobenius(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Restores the tensor-parallel state when a test leaves.
struct ParallelStateGuard {
  ParallelState saved = parallel_state();
  ~ParallelStateGuard() { set_parallel_state(saved); }
};

// ---------------------------------------------------------------- silu_and_mul

TEST(SiluAndMulGpu, MatchesOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, d, pad, offset;
  };
  // pad/offset: 0 = contiguous; multiples of 8 keep the 16-byte path; odd ones force the scalar path.
  const Case cases[] = {{1, 14336, 0, 0},  {1, 4096, 0, 0},    {7, 769, 0, 0},    {37, 5125, 0, 0},
                        {64, 14336, 0, 0}, {4100, 2048, 0, 0}, {33, 1536, 16, 8}, {33, 1536, 3, 1},
                        {300, 1024, 8, 0}, {2, 8, 0, 0},       {5, 1, 0, 0}};
  SiluAndMul op;
  uint64_t seed = 1;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " tokens " + std::to_string(c.tokens) + " d " + std::to_string(c.d) +
                   " pad " + std::to_string(c.pad) + " offset " + std::to_string(c.offset));
      const Pair x = strided_randn(c.tokens, 2 * c.d, c.pad, c.offset, dt, seed++);
      poison_next_output({c.tokens, c.d}, dt);
      const Tensor out_gpu = op.forward(x.gpu);
      const Tensor out_cpu = op.forward(x.cpu);
      expect_close(out_gpu, out_cpu, elementwise_tol(dt), "silu_and_mul");
    }
  }
}

TEST(SiluAndMulGpu, EmptyAndLargeInputs) {
  KBN_SKIP_WITHOUT_GPU();
  SiluAndMul op;
  const Tensor empty = op.forward(Tensor::empty({0, 256}, DType::bf16, kGpu));
  EXPECT_EQ(empty.shape(), (Shape{0, 128}));
  // Large |gate|: silu saturates to 0 (gate -> -inf) and to gate (gate -> +inf) without NaN.
  const Tensor x = Tensor::from_floats({-100.f, -20.f, 0.f, 20.f, 100.f, 2.f, 2.f, 2.f, 2.f, 2.f}, {1, 10}, DType::f32);
  expect_close(op.forward(x.to(kGpu)), op.forward(x), elementwise_tol(DType::f32), "silu_and_mul saturation");
}

// ---------------------------------------------------------------- rotary_embedding

TEST(RotaryEmbeddingGpu, MatchesOracleOnFusedQkvViews) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t head_size, rotary_dim;
    bool neox, llama3;
    int64_t num_heads, num_kv_heads, tokens, pad;
  };
  const Case cases[] = {
      {128, 128, true, true, 32, 8, 1, 0},    // Llama-3.1-8B decode, llama3 scaling
      {128, 128, true, false, 32, 8, 37, 0},  // prefill chunk
      {128, 128, true, true, 8, 2, 4100, 8},  // long prefill, padded rows
      {128, 64, true, false, 8, 2, 33, 0},    // partial rotary
      {128, 128, false, false, 8, 2, 33, 0},  // GPT-J style
      {64, 64, true, false, 16, 16, 19, 0},   // MHA, head 64
      {80, 80, true, false, 5, 1, 21, 3},     // odd head count, misaligned row stride -> scalar path
      {128, 36, true, false, 4, 2, 9, 0},     // rotary_dim / 2 not a multiple of the vector width
      {96, 96, false, false, 6, 2, 17, 5},    // GPT-J, odd pad
  };
  const int64_t max_position = 8192;
  uint64_t seed = 100;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " head " + std::to_string(c.head_size) + " rotary " +
                   std::to_string(c.rotary_dim) + (c.neox ? " neox" : " gptj") + (c.llama3 ? " llama3" : "") +
                   " heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " tokens " +
                   std::to_string(c.tokens) + " pad " + std::to_string(c.pad));
      RopeScaling scaling;
      if (c.llama3) {
        scaling.rope_type = "llama3";
        scaling.factor = 8.0;
        scaling.low_freq_factor = 1.0;
        scaling.high_freq_factor = 4.0;
        scaling.original_max_position_embeddings = 8192;
      }
      RotaryEmbedding rope_gpu(c.head_size, c.rotary_dim, max_position, 500000.0, c.neox, scaling, {dt, kGpu});
      RotaryEmbedding rope_cpu(c.head_size, c.rotary_dim, max_position, 500000.0, c.neox, scaling, {dt, kCpu});
      EXPECT_TRUE(rope_gpu.named_parameters().empty()) << "the cos/sin cache is a buffer, not a parameter";
      ASSERT_EQ(rope_gpu.cos_sin_cache.dtype(), dt);
      ASSERT_TRUE(rope_gpu.cos_sin_cache.is_cuda());
      expect_bitwise_equal(rope_gpu.cos_sin_cache, rope_cpu.cos_sin_cache, "cos_sin_cache");

      const int64_t q_size = c.num_heads * c.head_size, kv_size = c.num_kv_heads * c.head_size;
      const Pair qkv = randn({c.tokens, q_size + 2 * kv_size + c.pad}, dt, seed++);
      Tensor positions = Tensor::empty({c.tokens}, DType::i64, kCpu);
      fill_randint_(positions, seed++, 0, max_position);
      const Pair pos = from_host(positions);
      const Pair q = qkv.slice(1, 0, q_size), k = qkv.slice(1, q_size, q_size + kv_size);

      const auto [q_gpu, k_gpu] = rope_gpu.forward(pos.gpu, q.gpu, k.gpu);
      rope_cpu.forward(pos.cpu, q.cpu, k.cpu);
      EXPECT_EQ(q_gpu.data_ptr(), q.gpu.data_ptr()) << "rotary_embedding works in place";
      EXPECT_EQ(k_gpu.data_ptr(), k.gpu.data_ptr()) << "rotary_embedding works in place";
      // The whole fused tensor: q and k rotated alike, v and the padding untouched on both sides.
      expect_close(qkv.gpu, qkv.cpu, elementwise_tol(dt), "rotary_embedding qkv");
    }
  }
}

// Heads viewed with their own stride ([T, heads, head_size] slices of wider heads, as DeepSeek's MLA rotates q's rope
// part in place): the same bits as rotating a packed copy, the other features of each head untouched, against the
// oracle too. DeepSeek-V2-Lite's shape (16 heads of 192, rope 64 at 128, GPT-J style; k_pe a [T, 64] column slice),
// the NeoX vector path, and a head stride that breaks 16-byte alignment (the scalar path).
TEST(RotaryEmbeddingGpu, HeadStridedViewsSameBitsAsPackedCopies) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t heads, head_stride, offset, rope, tokens;
    bool neox;
  };
  const Case cases[] = {{16, 192, 128, 64, 1, false}, {16, 192, 128, 64, 37, false}, {8, 192, 128, 64, 9, true},
                        {4, 100, 36, 64, 5, true}};
  const int64_t max_position = 4096;
  uint64_t seed = 1500;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " heads " + std::to_string(c.heads) + " of " +
                   std::to_string(c.head_stride) + " rope [" + std::to_string(c.offset) + ", +" +
                   std::to_string(c.rope) + ") tokens " + std::to_string(c.tokens) + (c.neox ? " neox" : " gptj"));
      RotaryEmbedding rope(c.rope, c.rope, max_position, 10000.0, c.neox, RopeScaling{}, {dt, kGpu});
      RotaryEmbedding rope_cpu(c.rope, c.rope, max_position, 10000.0, c.neox, RopeScaling{}, {dt, kCpu});
      const int64_t T = c.tokens, W = 3 * c.rope + 8;  // k_pe: a column slice of a wider row
      const Pair q = randn({T, c.heads * c.head_stride}, dt, seed++), kv = randn({T, W}, dt, seed++);
      Tensor positions = Tensor::empty({T}, DType::i64, kCpu);
      fill_randint_(positions, seed++, 0, max_position);
      const Pair pos = from_host(positions);
      const auto view = [&](const Tensor& t) {
        return t.view({T, c.heads, c.head_stride}).slice(2, c.offset, c.offset + c.rope);
      };
      // Packed copies rotated as 2-D rows (the path every other model takes). Explicit copies: contiguous() of a
      // one-token slice is the slice itself (a single row is contiguous whatever its stride), which would alias kv.
      Tensor q_packed = Tensor::empty({T, c.heads, c.rope}, dt, kGpu), k_packed = Tensor::empty({T, c.rope}, dt, kGpu);
      q_packed.copy_(view(q.gpu));
      k_packed.copy_(kv.gpu.slice(1, 8, 8 + c.rope));
      q_packed = q_packed.view({T, c.heads * c.rope});
      rope.forward(pos.gpu, q_packed, k_packed);
      Tensor q_gpu = q.gpu.clone(), kv_gpu = kv.gpu.clone();
      rope.forward(pos.gpu, view(q_gpu), kv_gpu.slice(1, 8, 8 + c.rope));
      expect_bitwise_equal(view(q_gpu).contiguous().view({T, c.heads * c.rope}), q_packed, "q's rope part");
      expect_bitwise_equal(kv_gpu.slice(1, 8, 8 + c.rope).contiguous(), k_packed, "k_pe");
      expect_bitwise_equal(q_gpu.view({T, c.heads, c.head_stride}).slice(2, 0, c.offset).contiguous(),
                           q.gpu.view({T, c.heads, c.head_stride}).slice(2, 0, c.offset).contiguous(),
                           "the features before the rope part");
      // The oracle on the same views.
      Tensor q_cpu = q.cpu.clone(), kv_cpu = kv.cpu.clone();
      rope_cpu.forward(pos.cpu, view(q_cpu), kv_cpu.slice(1, 8, 8 + c.rope));
      expect_close(q_gpu, q_cpu, elementwise_tol(dt), "q vs oracle");
      expect_close(kv_gpu, kv_cpu, elementwise_tol(dt), "k vs oracle");
    }
  }
}

// fused_qk_norm_rope against the three ops it replaces on the same qkv rows (the per-head RMSNorm or GemmaRMSNorm of q
// and of k, then rotary_embedding in place): the same bits, at Qwen3's and Gemma-3's head sizes (32 for the tiny
// models), padded rows, every float type; and against the oracle. Positions outside the table leave the heads
// normalised but unrotated, as rotary_embedding leaves them.
TEST(FusedQKNormRopeGpu, SameBitsAsTheNormsThenRotary) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t head, heads, kv_heads, tokens, pad;
    bool gemma;
  };
  const Case cases[] = {{128, 32, 8, 1, 0, false},   {128, 32, 4, 37, 8, false}, {256, 16, 8, 5, 0, true},
                        {256, 8, 4, 300, 16, true},  {64, 16, 2, 19, 0, false},  {32, 4, 2, 23, 8, false},
                        {32, 4, 2, 7, 0, true},      {128, 8, 8, 2, 0, true}};
  const int64_t max_position = 4096;
  uint64_t seed = 700;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      if (!FusedQKNormRope::kernel_supports(dt, c.head)) continue;
      const std::string what = std::string(dtype_name(dt)) + " head " + std::to_string(c.head) + " heads " +
                               std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " tokens " +
                               std::to_string(c.tokens) + (c.gemma ? " gemma" : "");
      SCOPED_TRACE(what);
      const int64_t D = c.head, q_size = c.heads * D, kv_size = c.kv_heads * D, T = c.tokens;
      // pad > 0: the rows are a view of wider rows (a row stride past the width, as a fused projection's slice).
      const Pair wide = randn({T, q_size + 2 * kv_size + c.pad}, dt, seed++);
      const Pair qkv = wide.slice(1, 0, q_size + 2 * kv_size);
      const Pair q_weight = randn({D}, dt, seed++), k_weight = randn({D}, dt, seed++);
      Tensor positions = Tensor::empty({T}, DType::i64, kCpu);
      fill_randint_(positions, seed++, 0, max_position);
      if (T > 3) positions.data<int64_t>()[2] = max_position + 5;  // outside the table: normalised, not rotated
      const Pair pos = from_host(positions);
      RotaryEmbedding rope(D, D, max_position, c.gemma ? 10000.0 : 1000000.0, true, RopeScaling{}, {dt, kGpu});
      FusedQKNormRope fused(c.heads, c.kv_heads, D, 1e-6, c.gemma ? 1.0 : 0.0);
      const auto [q, k] = fused.forward(qkv.gpu, pos.gpu, q_weight.gpu, k_weight.gpu, rope.cos_sin_cache);
      ASSERT_TRUE(q.is_contiguous() && k.is_contiguous());

      // The three ops: per-head norms of the views inside the qkv rows, then rotary in place.
      const Tensor q_heads = qkv.gpu.as_strided({T, c.heads, D}, {qkv.gpu.stride(0), D, 1}, qkv.gpu.offset());
      const Tensor k_heads =
          qkv.gpu.as_strided({T, c.kv_heads, D}, {qkv.gpu.stride(0), D, 1}, qkv.gpu.offset() + q_size);
      Tensor q3, k3;
      if (c.gemma) {
        GemmaRMSNorm qn(D, 1e-6, {dt, kGpu}), kn(D, 1e-6, {dt, kGpu});
        qn.weight.copy_(q_weight.gpu);
        kn.weight.copy_(k_weight.gpu);
        q3 = qn.forward(q_heads).view({T, q_size});
        k3 = kn.forward(k_heads).view({T, kv_size});
      } else {
        RMSNorm qn(D, 1e-6, {dt, kGpu}), kn(D, 1e-6, {dt, kGpu});
        qn.weight.copy_(q_weight.gpu);
        kn.weight.copy_(k_weight.gpu);
        q3 = qn.forward(q_heads).view({T, q_size});
        k3 = kn.forward(k_heads).view({T, kv_size});
      }
      rope.forward(pos.gpu, q3, k3);
      expect_bitwise_equal(q, q3, "q: fused vs norm + rotary");
      expect_bitwise_equal(k, k3, "k: fused vs norm + rotary");

      // forward_store: q as forward gives it; the pages (poisoned with NaN) as store_kvcache writes k and the v view,
      // with padding tokens (slot -1) and, from 5 tokens, a slot past the pages (skipped).
      {
        const int64_t bs = 16, blocks = (T + 2) / bs + 2;
        const Tensor slot_mapping = Tensor::from_i64(scattered_slots(blocks * bs, T, seed++), {T}).to(kGpu);
        const Shape shape{blocks, bs, c.kv_heads, D};
        const auto poisoned = [&] { return Tensor::full(shape, kNaN, dt, kGpu); };
        const Tensor kc = poisoned(), vc = poisoned(), kc2 = poisoned(), vc2 = poisoned();
        const Tensor qs =
            fused.forward_store(qkv.gpu, pos.gpu, q_weight.gpu, k_weight.gpu, rope.cos_sin_cache, kc, vc, slot_mapping);
        const Tensor v = qkv.gpu.slice(1, q_size + kv_size, q_size + 2 * kv_size);
        StoreKVCache().forward(k.view({T, c.kv_heads, D}),
                               v.as_strided({T, c.kv_heads, D}, {v.stride(0), D, 1}, v.offset()), kc2, vc2,
                               slot_mapping);
        expect_bitwise_equal(qs, q, "forward_store's q vs forward's");
        expect_bitwise_equal(kc, kc2, "key_cache: forward_store vs forward + store_kvcache");
        expect_bitwise_equal(vc, vc2, "value_cache: forward_store vs store_kvcache");
      }

      // The oracle (its rotary refuses positions outside the table: compare the in-range tokens' path on a copy
      // whose out-of-range position is 0, on the GPU too).
      if (T > 3) {
        positions.data<int64_t>()[2] = 0;
        const Pair pos_in = from_host(positions);
        const auto [qg, kg] = fused.forward(qkv.gpu, pos_in.gpu, q_weight.gpu, k_weight.gpu, rope.cos_sin_cache);
        const auto [qc, kc] = fused.forward(qkv.cpu, pos_in.cpu, q_weight.cpu, k_weight.cpu,
                                            rope.cos_sin_cache.to(kCpu));
        // The normalised values are rounded to the dtype before the rotation, on both sides from sums in different
        // precision: one rounding step apart at most, which the rotation's cancellation (x c - y s) turns into an
        // absolute error up to about one unit of the largest normalised value, whatever the result's size.
        expect_close(qg, qc, rounded_operands_tol(dt, qc), "q vs oracle");
        expect_close(kg, kc, rounded_operands_tol(dt, kc), "k vs oracle");
      }
    }
  }
}

TEST(FusedQKNormRopeGpu, RefusesWhatTheKernelCannotTake) {
  KBN_SKIP_WITHOUT_GPU();
  FusedQKNormRope fused(2, 1, 96, 1e-6, 0.0);
  const Tensor qkv = Tensor::zeros({3, 4 * 96}, DType::bf16, kGpu), pos = Tensor::zeros({3}, DType::i64, kGpu);
  const Tensor w = Tensor::zeros({96}, DType::bf16, kGpu), cs = Tensor::zeros({16, 96}, DType::bf16, kGpu);
  try {
    fused.forward(qkv, pos, w, w, cs);
    FAIL() << "head_dim 96 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
}

// fused_rope_kvcache gives the bits of rotary_embedding (in place on the qkv views) then store_kvcache: q, and the
// whole pages (poisoned with NaN, so a stray write or a missed slot shows), on 16-bit and fp8 pages (unscaled and with
// per-tensor scales), with padding tokens (slot -1), a slot past the pages, a position outside the table (not rotated)
// and rows wider than the heads; and the oracle within the elementwise tolerance.
TEST(FusedRopeKVCacheGpu, SameBitsAsRotaryThenStore) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t head, heads, kv_heads, tokens, pad;
    bool fp8;
  };
  const Case cases[] = {{128, 32, 8, 1, 0, false},  {128, 32, 8, 37, 8, false}, {64, 64, 8, 300, 0, false},
                        {256, 16, 8, 5, 0, false},  {32, 4, 2, 23, 8, false},   {128, 32, 8, 70, 0, true},
                        {64, 16, 2, 19, 8, true},   {256, 8, 4, 9, 0, true},
                        {16, 4, 2, 11, 8, false},   {16, 4, 1, 6, 0, true}};
  const int64_t max_position = 4096, bs = 16;
  uint64_t seed = 760;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      if (!FusedRopeKVCache::kernel_supports(dt, c.head)) continue;
      for (const kbn::KVScales scales : {kbn::KVScales{}, kbn::KVScales{0.7f, 3.3f}}) {
        if (!c.fp8 && scales.k != 1.f) continue;  // scales apply to fp8 pages only
        const std::string what = std::string(dtype_name(dt)) + " head " + std::to_string(c.head) + " heads " +
                                 std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " tokens " +
                                 std::to_string(c.tokens) + (c.fp8 ? " fp8 k_scale " + std::to_string(scales.k) : "");
        SCOPED_TRACE(what);
        const int64_t D = c.head, q_size = c.heads * D, kv_size = c.kv_heads * D, T = c.tokens;
        const Pair wide = randn({T, q_size + 2 * kv_size + c.pad}, dt, seed++, c.fp8 ? 100.0 : 1.0);
        const Pair qkv = wide.slice(1, 0, q_size + 2 * kv_size);
        Tensor positions = Tensor::empty({T}, DType::i64, kCpu);
        fill_randint_(positions, seed++, 0, max_position);
        if (T > 3) positions.data<int64_t>()[2] = max_position + 5;  // outside the table: not rotated
        const Pair pos = from_host(positions);
        const int64_t blocks = (T + 2) / bs + 2, num_slots = blocks * bs;
        const std::vector<int64_t> slots = scattered_slots(num_slots, T, seed++);
        const Pair slot_mapping = from_host(Tensor::from_i64(slots, {T}));
        const DType kv = c.fp8 ? DType::fp8e4m3 : dt;
        const Shape shape{blocks, bs, c.kv_heads, D};
        const auto poisoned = [&] { return Tensor::full(shape, kNaN, kv, kCpu).to(kGpu); };
        RotaryEmbedding rope(D, D, max_position, 500000.0, true, RopeScaling{}, {dt, kGpu});
        FusedRopeKVCache fused(c.heads, c.kv_heads, D);

        const Tensor kc = poisoned(), vc = poisoned();
        const Tensor q = fused.forward(qkv.gpu, pos.gpu, rope.cos_sin_cache, kc, vc, slot_mapping.gpu, scales);
        ASSERT_TRUE(q.is_contiguous());
        ASSERT_EQ(q.shape(), (Shape{T, q_size}));

        // The two ops: rotary in place on the views of a copy of the rows, then the store of the rotated k and v.
        const Tensor rows = qkv.gpu.clone();  // a copy: rotary works in place
        Tensor q2 = rows.slice(1, 0, q_size), k2 = rows.slice(1, q_size, q_size + kv_size);
        rope.forward(pos.gpu, q2, k2);
        const Tensor v2 = rows.slice(1, q_size + kv_size, q_size + 2 * kv_size);
        const Tensor kc2 = poisoned(), vc2 = poisoned();
        StoreKVCache store;
        const auto heads = [&](const Tensor& t) { return t.as_strided({T, c.kv_heads, D}, {t.stride(0), D, 1}, t.offset()); };
        store.forward(heads(k2), heads(v2), kc2, vc2, slot_mapping.gpu, scales);
        expect_bitwise_equal(q, q2.contiguous(), "q: fused vs rotary");
        expect_bitwise_equal(kc, kc2, "key_cache: fused vs rotary + store");
        expect_bitwise_equal(vc, vc2, "value_cache: fused vs store");
        EXPECT_EQ(bytes_of(qkv.gpu), bytes_of(qkv.cpu)) << "qkv must be left untouched";

        // The oracle (its rotary refuses positions outside the table and its store slots past the pages: every
        // position in range here, and the slot past the pages is padding).
        if (T > 3) {
          positions.data<int64_t>()[2] = 0;
          const Pair pos_in = from_host(positions);
          std::vector<int64_t> slots_in = slots;
          for (int64_t& sl : slots_in)
            if (sl >= num_slots) sl = -1;
          const Pair slots_ok = from_host(Tensor::from_i64(slots_in, {T}));
          const Tensor kg = Tensor::zeros(shape, kv, kGpu), vg = Tensor::zeros(shape, kv, kGpu);
          Tensor kh = Tensor::zeros(shape, kv, kCpu), vh = Tensor::zeros(shape, kv, kCpu);
          const Tensor qg = fused.forward(qkv.gpu, pos_in.gpu, rope.cos_sin_cache, kg, vg, slots_ok.gpu, scales);
          const Tensor qh = fused.forward(qkv.cpu, pos_in.cpu, rope.cos_sin_cache.to(kCpu), kh, vh, slots_ok.cpu, scales);
          // Each product of the rotation rounded before the difference (x c - y s): the cancellation turns a rounding
          // step of the largest product into an absolute error (the fp8 cases' rows are 100x larger).
          expect_close(qg, qh, rounded_operands_tol(dt, qh), "q vs oracle");
          if (!c.fp8) {
            expect_close(kg, kh, rounded_operands_tol(dt, kh), "key_cache vs oracle");
            expect_bitwise_equal(vg, vh, "value_cache vs oracle");
          }
        }
      }
    }
  }
}

TEST(FusedRopeKVCacheGpu, RefusesWhatTheKernelCannotTake) {
  KBN_SKIP_WITHOUT_GPU();
  FusedRopeKVCache fused(2, 1, 96);
  const Tensor qkv = Tensor::zeros({3, 4 * 96}, DType::bf16, kGpu), pos = Tensor::zeros({3}, DType::i64, kGpu);
  const Tensor cs = Tensor::zeros({16, 96}, DType::bf16, kGpu), cache = Tensor::zeros({1, 16, 1, 96}, DType::bf16, kGpu);
  const Tensor slots = Tensor::zeros({3}, DType::i64, kGpu);
  try {
    fused.forward(qkv, pos, cs, cache, cache, slots);
    FAIL() << "head_dim 96 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
}

// rms_norm_gemv gives the bits of the ops it folds together (RMSNorm or GemmaRMSNorm, with or without the residual
// add, then Linear's one-token GEMV, then SiluAndMul or GeluAndMul("tanh")), h = x + residual included, at
// Llama-3.1-8B's, Gemma-3-12B's and Mamba-Codestral-7B's shapes (its fp32 residual stream with 16-bit x) and odd
// ones (a row the norm's warp kernel takes, rows past 256 and 2048 vectors, a partial last block, a bias, the largest
// staged row); and the oracle within linear's tolerance.
TEST(RMSNormGemvGpu, SameBitsAsNormThenLinear) {
  KBN_SKIP_WITHOUT_GPU();
  constexpr NormGemvAct kNone = NormGemvAct::none, kSilu = NormGemvAct::silu_and_mul,
                        kGelu = NormGemvAct::gelu_tanh_and_mul;
  struct Case {
    int64_t hidden, n;
    bool residual;
    NormGemvAct act;
    bool bias, gemma;
    bool f32_residual = false;  // 16-bit x only
  };
  const Case cases[] = {{4096, 18560, true, kNone, false, false, true}, {2056, 1003, true, kNone, true, false, true},
                        {64, 40, true, kNone, false, false, true},      {4096, 64, true, kSilu, false, false, true},
                        {8192, 41, true, kNone, true, false, true},  // fp32 h too wide to stage: re-read
                        {4096, 6144, true, kNone, false, false},  {4096, 6144, false, kNone, false, false},
                        {4096, 28672, true, kSilu, false, false}, {64, 96, true, kSilu, true, false},
                        {64, 40, false, kNone, false, false},     {2056, 1003, false, kNone, true, false},
                        {5120, 1002, true, kSilu, true, true},    {12288, 64, true, kNone, false, false},
                        {3840, 30720, true, kGelu, false, true},  {3840, 8192, true, kNone, false, true},
                        {72, 50, true, kGelu, true, true}};
  uint64_t seed = 900;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      if (!RMSNormGemv::kernel_supports(dt, 1, c.hidden)) continue;
      if (c.f32_residual && dt == DType::f32) continue;
      const std::string what = std::string(dtype_name(dt)) + " hidden " + std::to_string(c.hidden) + " n " +
                               std::to_string(c.n) + (c.residual ? " residual" : "") +
                               (c.f32_residual ? " (f32)" : "") + " act " + std::to_string(int(c.act)) +
                               (c.bias ? " bias" : "") + (c.gemma ? " gemma" : "");
      SCOPED_TRACE(what);
      const int64_t H = c.hidden, N = c.n;
      const Pair x = randn({1, H}, dt, seed++), residual = randn({1, H}, c.f32_residual ? DType::f32 : dt, seed++),
                 norm_weight = randn({H}, dt, seed++), weight = randn({N, H}, dt, seed++, 0.02),
                 bias = c.bias ? randn({N}, dt, seed++) : Pair{};
      const Tensor res_g = c.residual ? residual.gpu : Tensor();
      RMSNormGemv op(1e-5, c.gemma ? 1.0 : 0.0, c.act);
      const auto [out, h] = op.forward(x.gpu, res_g, norm_weight.gpu, weight.gpu, bias.gpu);
      ASSERT_EQ(out.shape(), (Shape{1, c.act != kNone ? N / 2 : N}));
      ASSERT_EQ(h.defined(), c.residual);

      // The ops it replaces, on copies (the norms work in place).
      Tensor y, h2;
      const Tensor xc = x.gpu.clone(), rc = residual.gpu.clone();
      const auto run_norm = [&](auto&& norm) {
        norm.weight.copy_(norm_weight.gpu);
        if (c.residual)
          std::tie(y, h2) = norm.forward(xc, rc);
        else
          y = norm.forward(xc);
      };
      if (c.gemma)
        run_norm(GemmaRMSNorm(H, 1e-5, {dt, kGpu}));
      else
        run_norm(RMSNorm(H, 1e-5, {dt, kGpu}));
      Tensor expected = Linear().forward(y, weight.gpu, bias.gpu);
      if (c.act == kSilu) expected = SiluAndMul().forward(expected);
      if (c.act == kGelu) expected = GeluAndMul("tanh").forward(expected);
      expect_bitwise_equal(out, expected, "out: fused vs norm + linear + the activation");
      if (c.residual) expect_bitwise_equal(h, h2, "h: fused vs fused_add_rms_norm's residual");
      EXPECT_EQ(bytes_of(x.gpu), bytes_of(x.cpu)) << "x must be left untouched";
      EXPECT_EQ(bytes_of(residual.gpu), bytes_of(residual.cpu)) << "residual must be left untouched";

      // The oracle (the op's CPU path composes the norm, linear and silu_and_mul oracles).
      const auto [out_c, h_c] = op.forward(x.cpu, c.residual ? residual.cpu : Tensor(), norm_weight.cpu, weight.cpu,
                                           bias.cpu);
      const double err = relative_frobenius(out.to(kCpu).to_doubles(), out_c.to_doubles());
      EXPECT_LT(err, frobenius_tol(dt)) << "out vs oracle: relative Frobenius error " << err;
      if (c.residual) expect_bitwise_equal(h, h_c, "h vs oracle");

      // forward_normed: the same out and h, and the norm's output written out (its bits).
      const auto [out_n, h_n, y_n] = op.forward_normed(x.gpu, res_g, norm_weight.gpu, weight.gpu, bias.gpu);
      expect_bitwise_equal(out_n, out, "forward_normed: out");
      if (c.residual) expect_bitwise_equal(h_n, h, "forward_normed: h");
      expect_bitwise_equal(y_n, y, "forward_normed: y vs the norm's output");
    }
  }
}

TEST(RMSNormGemvGpu, RefusesWhatTheKernelCannotTake) {
  KBN_SKIP_WITHOUT_GPU();
  RMSNormGemv op(1e-5);
  const Tensor x = Tensor::zeros({2, 64}, DType::bf16, kGpu), w = Tensor::zeros({64}, DType::bf16, kGpu),
               weight = Tensor::zeros({16, 64}, DType::bf16, kGpu);
  try {
    op.forward(x, Tensor(), w, weight, Tensor());
    FAIL() << "two tokens were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one token"), std::string::npos) << e.what();
  }
  RMSNormGemv silu(1e-5, 0.0, NormGemvAct::silu_and_mul);
  try {
    silu.forward(x.slice(0, 0, 1), Tensor(), w, Tensor::zeros({15, 64}, DType::bf16, kGpu), Tensor());
    FAIL() << "an odd out_features was accepted with an activation";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("even out_features"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- embedding

// The expected gather, computed here from the weight bytes: rows of [vocab_start, vocab_end), zeros elsewhere.
std::vector<uint8_t> expected_gather(const Tensor& weight_cpu, const std::vector<int64_t>& ids, int64_t vocab_start,
                                     int64_t vocab_end) {
  const Tensor w = weight_cpu.contiguous();
  const size_t row = size_t(w.size(1)) * w.element_size();
  std::vector<uint8_t> out(ids.size() * row, 0);
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] >= vocab_start && ids[t] < vocab_end)
      std::memcpy(out.data() + t * row, static_cast<const uint8_t*>(w.data_ptr()) + size_t(ids[t] - vocab_start) * row,
                  row);
  return out;
}

TEST(EmbeddingGpu, BitwiseEqualToOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t vocab, hidden, tokens, pad;
  };
  const Case cases[] = {{5125, 4096, 1, 0},  {5125, 4096, 37, 0}, {5125, 4096, 4100, 0}, {1000, 769, 33, 0},
                        {1000, 1024, 65, 8}, {1000, 1024, 65, 1}, {300, 8, 5, 0}};
  Embedding op;
  uint64_t seed = 200;
  for (DType dt : kFloatTypes) {
    for (DType id_dt : {DType::i32, DType::i64}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " ids " + dtype_name(id_dt) + " vocab " + std::to_string(c.vocab) +
                     " hidden " + std::to_string(c.hidden) + " tokens " + std::to_string(c.tokens) + " pad " +
                     std::to_string(c.pad));
        const Pair weight = strided_randn(c.vocab, c.hidden, c.pad, 0, dt, seed++);
        Tensor ids = Tensor::empty({c.tokens}, id_dt, kCpu);
        fill_randint_(ids, seed++, 0, c.vocab);
        const Pair id = from_host(ids);
        poison_next_output({c.tokens, c.hidden}, dt);
        const Tensor out_gpu = op.forward(id.gpu, weight.gpu, 0, c.vocab);
        const Tensor out_cpu = op.forward(id.cpu, weight.cpu, 0, c.vocab);
        expect_bitwise_equal(out_gpu, out_cpu, "embedding");
        EXPECT_EQ(bytes_of(out_gpu), expected_gather(weight.cpu, ids.to_ints(), 0, c.vocab)) << "embedding rows";
      }
    }
  }
}

// Gemma's scaled embedding: the GPU's products round exactly as the CPU's (a product of two values of the dtype is
// exact in f32 for bf16 and f16, and f32 rounds it once either way), so the outputs are bitwise equal.
TEST(EmbeddingGpu, ScaledRowsBitwiseEqualToTheCpu) {
  KBN_SKIP_WITHOUT_GPU();
  Embedding op;
  uint64_t seed = 250;
  for (DType dt : kFloatTypes) {
    for (const double scale : {std::sqrt(3840.0), std::sqrt(2880.0), 1.0, 0.125}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " scale " + std::to_string(scale));
      const Pair weight = randn({1000, 3840}, dt, seed++);
      Tensor ids = Tensor::empty({300}, DType::i64, kCpu);
      fill_randint_(ids, seed++, 0, 1000);
      const Pair id = from_host(ids);
      poison_next_output({300, 3840}, dt);
      expect_bitwise_equal(op.forward(id.gpu, weight.gpu, 0, 1000, scale),
                           op.forward(id.cpu, weight.cpu, 0, 1000, scale), "embedding x scale");
    }
  }
}

TEST(EmbeddingGpu, TensorParallelShardGivesZeroRowsOutsideIt) {
  KBN_SKIP_WITHOUT_GPU();
  Embedding op;
  const int64_t vocab = 5125, hidden = 4096, start = 1000, end = 3000, tokens = 257;
  uint64_t seed = 300;
  for (DType dt : kFloatTypes) {
    for (DType id_dt : {DType::i32, DType::i64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " ids " + dtype_name(id_dt));
      const Pair shard = randn({end - start, hidden}, dt, seed++);
      Tensor ids = Tensor::empty({tokens}, id_dt, kCpu);
      fill_randint_(ids, seed++, 0, vocab);
      const Pair id = from_host(ids);
      poison_next_output({tokens, hidden}, dt);
      const Tensor out_gpu = op.forward(id.gpu, shard.gpu, start, end);
      const Tensor out_cpu = op.forward(id.cpu, shard.cpu, start, end);
      expect_bitwise_equal(out_gpu, out_cpu, "embedding shard");
      EXPECT_EQ(bytes_of(out_gpu), expected_gather(shard.cpu, ids.to_ints(), start, end)) << "embedding shard rows";
    }
  }
}

TEST(EmbeddingGpu, OutOfRangeIdsGiveZeroRowsOnGpu) {
  KBN_SKIP_WITHOUT_GPU();
  Embedding op;
  const Pair weight = randn({100, 256}, DType::bf16, 400);
  const std::vector<int64_t> ids = {-1, 0, 99, 100, 1 << 20, 42};
  const Tensor out = op.forward(Tensor::from_i64(ids, {6}).to(kGpu), weight.gpu, 0, 100);
  EXPECT_EQ(bytes_of(out), expected_gather(weight.cpu, ids, 0, 100));
}

// ---------------------------------------------------------------- linear

// Checks out_gpu against the CPU op on a sample of rows (all rows when the oracle's work is small).
void check_linear(const Pair& x, const Pair& weight, const Pair& bias, const Tensor& out_gpu, DType dt,
                  const std::string& what) {
  Linear op;
  const int64_t m = x.cpu.size(0), k = x.cpu.size(1), n = weight.cpu.size(0);
  std::vector<int64_t> rows(static_cast<size_t>(m));
  std::iota(rows.begin(), rows.end(), 0);
  // NOTE: the oracle runs in double on one core; beyond ~2e8 multiply-adds only 8 rows (first, last, spread
  // between) are recomputed there. Rows of a GEMM are independent, so sampled rows still catch layout bugs.
  if (m * k * n > 200'000'000) {
    rows.clear();
    for (int64_t i = 0; i < 8; ++i) rows.push_back(i * (m - 1) / 7);
  }
  Tensor x_rows = Tensor::empty({int64_t(rows.size()), k}, dt, kCpu);
  for (size_t i = 0; i < rows.size(); ++i) x_rows.select(0, int64_t(i)).copy_(x.cpu.select(0, rows[i]));
  const Tensor expected = op.forward(x_rows, weight.cpu, bias.cpu);
  const Tensor got_all = out_gpu.to(kCpu);
  Tensor got = Tensor::empty(expected.shape(), dt, kCpu);
  for (size_t i = 0; i < rows.size(); ++i) got.select(0, int64_t(i)).copy_(got_all.select(0, rows[i]));
  const double err = relative_frobenius(got.to_doubles(), expected.to_doubles());
  EXPECT_LT(err, frobenius_tol(dt)) << what << ": relative Frobenius error " << err << " over " << rows.size()
                                    << " rows";
}

TEST(LinearGpu, MatchesOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t m, k, n;
    bool bias;
    int64_t pad;  // x row stride = k + pad
  };
  const Case cases[] = {{1, 4096, 4096, false, 0},
                        {37, 769, 5125, false, 0},
                        {37, 769, 5125, true, 0},
                        {512, 4096, 14336, false, 0},
                        {7, 4096, 6144, true, 0},
                        {64, 1024, 1000, false, 64},
                        {33, 768, 512, true, 3},
                        {4100, 1024, 512, false, 0},
                        {1, 8, 3, true, 0},
                        // one token takes the GEMV: the 8B down projection's k, a row tail (k not a multiple of
                        // 256 elements), an odd n; rows 16-byte vectors cannot walk (k = 770) stay on cuBLASLt,
                        // as do 2..8 tokens
                        {1, 14336, 4096, false, 0},
                        {1, 776, 300, true, 0},
                        {1, 1000, 777, true, 0},
                        {1, 770, 64, false, 0},
                        {2, 776, 300, true, 8},
                        {4, 14336, 512, false, 0},
                        {8, 4096, 2048, true, 0},
                        {2, 768, 64, true, 1}};
  uint64_t seed = 500;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(c.m) + "x" + std::to_string(c.k) + "x" +
                   std::to_string(c.n) + (c.bias ? " bias" : "") + " pad " + std::to_string(c.pad));
      const Pair x = strided_randn(c.m, c.k, c.pad, 0, dt, seed++);
      // Weights at the 1/sqrt(k) scale of real layers keep outputs O(1).
      const Pair weight = randn({c.n, c.k}, dt, seed++, 1.0 / std::sqrt(double(c.k)));
      const Pair bias = c.bias ? randn({c.n}, dt, seed++) : Pair{};
      poison_next_output({c.m, c.n}, dt);
      Linear op;
      const Tensor out = op.forward(x.gpu, weight.gpu, bias.gpu);
      ASSERT_EQ(out.shape(), (Shape{c.m, c.n}));
      check_linear(x, weight, bias, out, dt, "linear");
      // A second call reuses the cached plan and must give the same bits.
      const Tensor again = op.forward(x.gpu, weight.gpu, bias.gpu);
      expect_bitwise_equal(again, out, "linear repeat");
    }
  }
}

TEST(RouterGemmGpu, F32LogitsFrom16BitOperandsAreNotRounded) {
  KBN_SKIP_WITHOUT_GPU();
  // DeepSeek's routers: bf16 x and weight, f32 logits. Against the oracle's double sums rounded once to f32 the error
  // is f32 accumulation's (~1e-7 relative); logits rounded to 16 bits would be ~1e-3 off.
  uint64_t seed = 700;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (auto [m, k, n] :
         {std::tuple{1, 2048, 64}, std::tuple{22, 1710, 8}, std::tuple{300, 7168, 256}, std::tuple{1, 776, 300}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(m) + "x" + std::to_string(k) + "x" +
                   std::to_string(n));
      const Pair x = randn({m, k}, dt, seed++);
      const Pair weight = randn({n, k}, dt, seed++, 1.0 / std::sqrt(double(k)));
      RouterGemm op;
      const Tensor out = op.forward(x.gpu, weight.gpu);
      ASSERT_EQ(out.dtype(), DType::f32);
      const double err = relative_frobenius(out.to(kCpu).to_doubles(), op.forward(x.cpu, weight.cpu).to_doubles());
      EXPECT_LT(err, 1e-5) << "relative Frobenius error";
    }
  }
}

TEST(LinearGpu, ZeroTokensReturnsEmpty) {
  KBN_SKIP_WITHOUT_GPU();
  Linear op;
  const Pair weight = randn({64, 32}, DType::bf16, 600);
  const Tensor out = op.forward(Tensor::empty({0, 32}, DType::bf16, kGpu), weight.gpu, Tensor());
  EXPECT_EQ(out.shape(), (Shape{0, 64}));
  EXPECT_TRUE(out.is_cuda());
}

// ---------------------------------------------------------------- all_reduce

TEST(AllReduceGpu, SingleRankReturnsInputUntouched) {
  KBN_SKIP_WITHOUT_GPU();
  ParallelStateGuard guard;
  set_parallel_state({0, 1, nullptr});
  AllReduce op;
  const Pair x = randn({37, 4096}, DType::bf16, 700);
  const Tensor y = op.forward(x.gpu);
  EXPECT_EQ(y.data_ptr(), x.gpu.data_ptr());
  expect_bitwise_equal(y, x.cpu, "all_reduce tp 1");
}

TEST(AllReduceGpu, MultiRankRefusesWhatItCannotReduce) {
  KBN_SKIP_WITHOUT_GPU();
  ParallelStateGuard guard;
  set_parallel_state({0, 2, nullptr});
  AllReduce op;
  // Without a communicator (outside engine::TensorParallelGroup) nothing can be reduced.
  EXPECT_THROW(op.forward(Tensor::zeros({4, 8}, DType::bf16, kCpu)), Error);
  EXPECT_THROW(op.forward(Tensor::zeros({4, 8}, DType::bf16, kGpu)), Error);
}

// ---------------------------------------------------------------- store_kvcache

TEST(StoreKVCacheGpu, BitwiseEqualToOracleAndSkipsPadding) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t num_blocks, block_size, num_kv_heads, head_size, num_heads, tokens, pad;
  };
  const Case cases[] = {
      {64, 16, 8, 128, 32, 1, 0},      // decode, Llama-3-8B heads
      {64, 16, 8, 128, 32, 37, 0},     // small prefill
      {300, 16, 8, 128, 32, 4100, 8},  // long prefill, padded token rows
      {40, 32, 4, 64, 8, 100, 0},      // block 32, head 64
      {20, 16, 2, 72, 4, 50, 0},       // head 72: 144 bytes in bf16, still whole 16-byte vectors
      {20, 16, 3, 36, 6, 50, 1},       // head 36 and odd pad: 2-byte copy path
  };
  StoreKVCache op;
  uint64_t seed = 800;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " blocks " + std::to_string(c.num_blocks) + "x" +
                   std::to_string(c.block_size) + " kv heads " + std::to_string(c.num_kv_heads) + " head " +
                   std::to_string(c.head_size) + " tokens " + std::to_string(c.tokens) + " pad " +
                   std::to_string(c.pad));
      const int64_t hd = c.head_size, kvh = c.num_kv_heads, q_size = c.num_heads * hd, kv_size = kvh * hd;
      const Pair qkv = randn({c.tokens, q_size + 2 * kv_size + c.pad}, dt, seed++);
      // key and value: [tokens, kv_heads, head] views into the fused qkv rows (token stride > kv_heads * head).
      const Pair key = qkv_view(qkv, {c.tokens, kvh, hd}, q_size);
      const Pair value = qkv_view(qkv, {c.tokens, kvh, hd}, q_size + kv_size);

      // Distinct random slots; every 7th token is padding (-1).
      const int64_t num_slots = c.num_blocks * c.block_size;
      std::vector<int64_t> slots(static_cast<size_t>(num_slots));
      std::iota(slots.begin(), slots.end(), 0);
      std::mt19937_64 rng(seed++);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(size_t(c.tokens));
      for (size_t t = 3; t < slots.size(); t += 7) slots[t] = -1;
      const Pair slot_mapping = from_host(Tensor::from_i64(slots, {c.tokens}));

      // Caches poisoned with NaN, with one poisoned guard block on each side inside the same allocation.
      const Shape cache_shape{c.num_blocks + 2, c.block_size, kvh, hd};
      const Tensor k_all = Tensor::full(cache_shape, kNaN, dt, kGpu), v_all = Tensor::full(cache_shape, kNaN, dt, kGpu);
      const Pair k_store{k_all.to(kCpu), k_all}, v_store{v_all.to(kCpu), v_all};
      const std::vector<uint8_t> poison = bytes_of(k_all.slice(0, 0, 1));
      const Pair key_cache = k_store.slice(0, 1, c.num_blocks + 1), value_cache = v_store.slice(0, 1, c.num_blocks + 1);

      op.forward(key.gpu, value.gpu, key_cache.gpu, value_cache.gpu, slot_mapping.gpu);
      op.forward(key.cpu, value.cpu, key_cache.cpu, value_cache.cpu, slot_mapping.cpu);
      expect_bitwise_equal(k_store.gpu, k_store.cpu, "key_cache (with guard blocks)");
      expect_bitwise_equal(v_store.gpu, v_store.cpu, "value_cache (with guard blocks)");

      // Independently of the oracle: stored rows equal the token's key/value bits; every other slot and
      // both guard blocks keep the poison.
      const Tensor kc = key_cache.gpu.to(kCpu).view({num_slots, kvh, hd});
      const Tensor vc = value_cache.gpu.to(kCpu).view({num_slots, kvh, hd});
      std::vector<bool> written(size_t(num_slots), false);
      for (int64_t t = 0; t < c.tokens; ++t) {
        const int64_t s = slots[size_t(t)];
        if (s < 0) continue;
        written[size_t(s)] = true;
        EXPECT_EQ(bytes_of(kc.select(0, s)), bytes_of(key.cpu.select(0, t))) << "key of token " << t;
        EXPECT_EQ(bytes_of(vc.select(0, s)), bytes_of(value.cpu.select(0, t))) << "value of token " << t;
      }
      const std::vector<uint8_t> poison_row(poison.begin(),
                                            poison.begin() + int64_t(kv_size * int64_t(kc.element_size())));
      int64_t touched = 0;
      for (int64_t s = 0; s < num_slots; ++s)
        if (!written[size_t(s)] && bytes_of(kc.select(0, s)) != poison_row) ++touched;
      EXPECT_EQ(touched, 0) << "slots outside slot_mapping were written";
      EXPECT_EQ(bytes_of(k_all.slice(0, 0, 1)), poison) << "guard block before the key cache";
      EXPECT_EQ(bytes_of(k_all.slice(0, c.num_blocks + 1, c.num_blocks + 2)), poison)
          << "guard block after the key cache";
    }
  }
}

// fp8 e4m3 caches (--kv-cache-dtype fp8_e4m3): every element converted once, rounded to nearest even and saturated
// at +-448 (keys scaled past it here), bit for bit the CPU oracle's, unscaled and with per-tensor scales; padding rows
// and other slots untouched.
TEST(StoreKVCacheGpu, Fp8CachesRoundLikeTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  StoreKVCache op;
  uint64_t seed = 850;
  // Tokens x head size: the 8-wide kernel one token per block (300 x 128) and four (2500 x 64), and the scalar kernel
  // for heads that are not a multiple of 8 (50 x 20).
  struct Shape3 {
    int64_t tokens, hd;
  };
  for (const Shape3 c : {Shape3{300, 128}, Shape3{2500, 64}, Shape3{50, 20}})
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " tokens " + std::to_string(c.tokens) + " head " +
                   std::to_string(c.hd));
      const int64_t tokens = c.tokens, kvh = 8, hd = c.hd, bs = 16, blocks = (tokens + 40) / bs + 1;
      const Pair qkv = randn({tokens, 3 * kvh * hd}, dt, seed++, 300.0);  // std 300: many elements saturate
      const Pair key = qkv_view(qkv, {tokens, kvh, hd}, 0), value = qkv_view(qkv, {tokens, kvh, hd}, kvh * hd);
      std::vector<int64_t> slots(static_cast<size_t>(blocks * bs));
      std::iota(slots.begin(), slots.end(), 0);
      std::mt19937_64 rng(seed++);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(size_t(tokens));
      for (size_t t = 5; t < slots.size(); t += 9) slots[t] = -1;
      const Pair slot_mapping = from_host(Tensor::from_i64(slots, {tokens}));
      const Shape shape{blocks, bs, kvh, hd};
      const Pair kc{Tensor::zeros(shape, DType::fp8e4m3, kCpu), Tensor::zeros(shape, DType::fp8e4m3, kGpu)};
      const Pair vc{Tensor::zeros(shape, DType::fp8e4m3, kCpu), Tensor::zeros(shape, DType::fp8e4m3, kGpu)};
      op.forward(key.gpu, value.gpu, kc.gpu, vc.gpu, slot_mapping.gpu);
      op.forward(key.cpu, value.cpu, kc.cpu, vc.cpu, slot_mapping.cpu);
      expect_bitwise_equal(kc.gpu, kc.cpu, "fp8 key_cache");
      expect_bitwise_equal(vc.gpu, vc.cpu, "fp8 value_cache");
      // Per-tensor scales (a calibrated checkpoint's k_scale / v_scale): float(x) / scale, rounded once, as the oracle.
      // k_scale 0.7 pushes more keys past 448 (saturated), v_scale 3.3 brings most values back into range.
      const kbn::KVScales scales{0.7f, 3.3f};
      op.forward(key.gpu, value.gpu, kc.gpu, vc.gpu, slot_mapping.gpu, scales);
      op.forward(key.cpu, value.cpu, kc.cpu, vc.cpu, slot_mapping.cpu, scales);
      expect_bitwise_equal(kc.gpu, kc.cpu, "fp8 key_cache, k_scale 0.7");
      expect_bitwise_equal(vc.gpu, vc.cpu, "fp8 value_cache, v_scale 3.3");
    }
}

TEST(StoreKVCacheGpu, AllPaddingLeavesCachesUntouched) {
  KBN_SKIP_WITHOUT_GPU();
  StoreKVCache op;
  const Pair kv = randn({5, 8, 128}, DType::bf16, 900);
  const Tensor key_cache = Tensor::full({4, 16, 8, 128}, kNaN, DType::bf16, kGpu);
  const Tensor value_cache = Tensor::full({4, 16, 8, 128}, kNaN, DType::bf16, kGpu);
  const std::vector<uint8_t> before = bytes_of(key_cache);
  op.forward(kv.gpu, kv.gpu, key_cache, value_cache, Tensor::from_i64({-1, -1, -1, -1, -1}, {5}).to(kGpu));
  EXPECT_EQ(bytes_of(key_cache), before);
  EXPECT_EQ(bytes_of(value_cache), before);
}

// ---------------------------------------------------------------- argmax

TEST(ArgmaxGpu, MatchesOracleOnRandomLogits) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, vocab, pad;
  };
  // Random bf16 logits over a large vocabulary hold many exact ties at the maximum.
  const Case cases[] = {{1, 128256, 0}, {64, 128256, 0}, {4100, 5125, 0}, {37, 769, 0},
                        {33, 32000, 8}, {33, 32000, 3},  {3, 1, 0},       {2, 7, 0}};
  Argmax op;
  uint64_t seed = 1000;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " tokens " + std::to_string(c.tokens) + " vocab " +
                   std::to_string(c.vocab) + " pad " + std::to_string(c.pad));
      const Pair logits = strided_randn(c.tokens, c.vocab, c.pad, 0, dt, seed++);
      poison_next_output({c.tokens}, DType::i64);
      const Tensor got = op.forward(logits.gpu);
      const Tensor want = op.forward(logits.cpu);
      ASSERT_EQ(got.dtype(), DType::i64);
      EXPECT_EQ(got.to_ints(), want.to_ints());
    }
  }
}

TEST(ArgmaxGpu, TiesNaNAndInfinities) {
  KBN_SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // 40000 entries: several 16-byte vectors per thread and two unrolled steps of the 1024-thread block.
  const int64_t vocab = 40000;
  std::vector<std::vector<float>> rows;
  std::vector<int64_t> expected;
  auto add = [&](const std::function<void(std::vector<float>&)>& edit, int64_t want) {
    std::vector<float> r(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) r[size_t(v)] = float((v * 37) % 101) / 101.f - 2.f;  // all in [-2, -1)
    edit(r);
    rows.push_back(r);
    expected.push_back(want);
  };
  // Ties: the lowest index wins, whichever thread or step holds it.
  add([](std::vector<float>& r) { r[30000] = r[17] = r[2500] = 3.f; }, 17);
  add([](std::vector<float>& r) { r[4095] = r[4096] = 1.f; }, 4095);
  add([](std::vector<float>& r) { r[8192] = r[8] = 1.f; }, 8);        // thread 0's 2nd vector vs thread 1's 1st
  add([](std::vector<float>& r) { r[32768 + 5] = r[5] = 0.5f; }, 5);  // one thread, two unrolled steps
  add(
      [](std::vector<float>& r) {
        std::fill(r.begin(), r.end(), 0.f);
        r[7] = -0.f;
      },
      0);  // -0 == +0
  // NaN never wins; an all-NaN row gives 0.
  add(
      [&](std::vector<float>& r) {
        r[0] = nan;
        r[10] = 1.f;
        r[11] = nan;
      },
      10);
  add([&](std::vector<float>& r) { std::fill(r.begin(), r.end(), nan); }, 0);
  add(
      [&](std::vector<float>& r) {
        std::fill(r.begin(), r.end(), nan);
        r[vocab - 1] = -5.f;
      },
      vocab - 1);
  // Infinities compare like numbers.
  add([&](std::vector<float>& r) { std::fill(r.begin(), r.end(), -inf); }, 0);
  add(
      [&](std::vector<float>& r) {
        r[3333] = r[3334] = inf;
        r[12] = nan;
      },
      3333);
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  Argmax op;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor logits = Tensor::from_floats(flat, {int64_t(rows.size()), vocab}, dt);
    poison_next_output({int64_t(rows.size())}, DType::i64);
    const Tensor got = op.forward(logits.to(kGpu));
    EXPECT_EQ(got.to_ints(), expected);
    EXPECT_EQ(op.forward(logits).to_ints(), expected) << "the oracle disagrees with the constructed answers";
  }
}

// ---------------------------------------------------------------- gelu_and_mul (Gemma-3)

TEST(GeluAndMulGpu, MatchesOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, d, pad, offset;
  };
  // Gemma-3-12B's I = 15360 at decode and prefill sizes; odd widths and pads force the scalar path.
  const Case cases[] = {{1, 15360, 0, 0},  {37, 15360, 0, 0}, {7, 769, 0, 0}, {37, 5125, 0, 0},
                        {33, 1536, 16, 8}, {33, 1536, 3, 1},  {2, 8, 0, 0},   {5, 1, 0, 0}};
  uint64_t seed = 700;
  for (const char* approximate : {"tanh", "none"}) {
    GeluAndMul op(approximate);
    for (DType dt : kFloatTypes) {
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(approximate) + " " + dtype_name(dt) + " tokens " + std::to_string(c.tokens) + " d " +
                     std::to_string(c.d) + " pad " + std::to_string(c.pad) + " offset " + std::to_string(c.offset));
        const Pair x = strided_randn(c.tokens, 2 * c.d, c.pad, c.offset, dt, seed++);
        poison_next_output({c.tokens, c.d}, dt);
        expect_close(op.forward(x.gpu), op.forward(x.cpu), elementwise_tol(dt), "gelu_and_mul");
      }
    }
  }
}

TEST(GeluAndMulGpu, EmptyAndSaturatingInputs) {
  KBN_SKIP_WITHOUT_GPU();
  GeluAndMul op("tanh");
  EXPECT_EQ(op.forward(Tensor::empty({0, 256}, DType::bf16, kGpu)).shape(), (Shape{0, 128}));
  // gelu(-100) = -0 and gelu(100) = 100 in both forms, without NaN from the cube.
  const Tensor x = Tensor::from_floats({-100.f, -5.f, 0.f, 5.f, 100.f, 2.f, 2.f, 2.f, 2.f, 2.f}, {1, 10}, DType::f32);
  for (const char* approximate : {"tanh", "none"}) {
    GeluAndMul g(approximate);
    expect_close(g.forward(x.to(kGpu)), g.forward(x), elementwise_tol(DType::f32), "gelu_and_mul saturation");
  }
}

// ---------------------------------------------------------------- swiglu_oai_and_mul (gpt-oss)

TEST(SwigluOaiAndMulGpu, MatchesOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, d, pad, offset;
  };
  // gpt-oss-20b: N = 2880 per expert, rows = tokens x top_k 4; odd widths, odd pads and offsets take the scalar
  // path (an odd offset breaks the 16-byte alignment of the interleaved pairs).
  const Case cases[] = {{4, 2880, 0, 0},   {148, 2880, 0, 0}, {7, 769, 0, 0},   {37, 5125, 0, 0},
                        {33, 1536, 16, 8}, {33, 1536, 3, 1},  {33, 1536, 2, 2}, {5, 1, 0, 0}};
  SwigluOAIAndMul op(1.702, 7.0);
  uint64_t seed = 800;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(c.rows) + " d " + std::to_string(c.d) +
                   " pad " + std::to_string(c.pad) + " offset " + std::to_string(c.offset));
      // std 4: many gates and ups beyond the limit 7, so both clamps are exercised.
      const Pair x = randn({c.rows, 2 * c.d + c.pad}, dt, seed++, 4.0).slice(1, c.offset, c.offset + 2 * c.d);
      poison_next_output({c.rows, c.d}, dt);
      expect_close(op.forward(x.gpu), op.forward(x.cpu), elementwise_tol(dt), "swiglu_oai_and_mul");
    }
  }
}

TEST(SwigluOaiAndMulGpu, ClampsAndPropagatesNaN) {
  KBN_SKIP_WITHOUT_GPU();
  SwigluOAIAndMul op(1.702, 7.0);
  // (gate, up) pairs at and beyond the limits, and a NaN gate that must stay NaN (torch.clamp keeps NaN).
  const Tensor x = Tensor::from_floats({100.f, -100.f, -100.f, 100.f, 7.f, 7.f, -7.f, -7.f, 0.f, 3.f}, {1, 10});
  expect_close(op.forward(x.to(kGpu)), op.forward(x), elementwise_tol(DType::f32), "swiglu_oai_and_mul clamps");
  const Tensor nan_gate = Tensor::from_floats({float(kNaN), 1.f, 1.f, 1.f}, {1, 4}).to(kGpu);
  const std::vector<double> out = op.forward(nan_gate).to_doubles();
  EXPECT_TRUE(std::isnan(out[0])) << "a NaN gate gives NaN, got " << out[0];
  EXPECT_TRUE(std::isfinite(out[1]));
}

// ---------------------------------------------------------------- gemma_rms_norm (Gemma-3)

TEST(GemmaRmsNormGpu, MatchesOracleWithRandomWeights) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, hidden, pad;
  };
  // Gemma-3-12B's 3840, gpt-oss's 2880 (for scale), wide, odd and padded rows.
  const Case cases[] = {{1, 3840, 0}, {37, 3840, 0}, {300, 3840, 8}, {4, 8192, 0},
                        {7, 769, 0},  {5, 5125, 3},  {3, 2880, 0},   {2, 8, 0}};
  uint64_t seed = 900;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " tokens " + std::to_string(c.tokens) + " hidden " +
                   std::to_string(c.hidden) + " pad " + std::to_string(c.pad));
      GemmaRMSNorm norm_gpu(c.hidden, 1e-6, {dt, kGpu}), norm_cpu(c.hidden, 1e-6, {dt, kCpu});
      // Trained Gemma weights are offsets of either sign around 0 (scale 1 + w); zeros would hide a lost weight.
      const Pair w = randn({c.hidden}, dt, seed++, 0.5);
      norm_gpu.weight.copy_(w.gpu);
      norm_cpu.weight.copy_(w.cpu);
      const Pair x = strided_randn(c.tokens, c.hidden, c.pad, 0, dt, seed++);
      poison_next_output({c.tokens, c.hidden}, dt);
      expect_close(norm_gpu.forward(x.gpu), norm_cpu.forward(x.cpu), elementwise_tol(dt), "gemma_rms_norm");

      const Pair xf = strided_randn(c.tokens, c.hidden, c.pad, 0, dt, seed++);
      const Pair res = randn({c.tokens, c.hidden}, dt, seed++);
      const auto [y_gpu, r_gpu] = norm_gpu.forward(xf.gpu, res.gpu);
      norm_cpu.forward(xf.cpu, res.cpu);
      EXPECT_EQ(y_gpu.data_ptr(), xf.gpu.data_ptr()) << "the fused norm works in place";
      // The new residual is one rounded sum on both sides: bitwise equal; the output within tolerance.
      expect_bitwise_equal(r_gpu, res.cpu, "gemma_fused_add_rms_norm residual");
      expect_close(y_gpu, xf.cpu, elementwise_tol(dt), "gemma_fused_add_rms_norm x");
    }
  }
}

TEST(GemmaRmsNormGpu, PerHeadQkNormsOnFusedQkvViews) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, heads, kv_heads, head_dim;
  };
  // Gemma-3-12B: 16 q and 8 kv heads of 256 (the warp-per-row kernel); 64-wide heads; 36-wide (bf16/f16: the
  // block-per-row scalar path).
  const Case cases[] = {{1, 16, 8, 256}, {37, 16, 8, 256}, {300, 16, 8, 256}, {9, 8, 2, 64}, {5, 4, 2, 36}};
  uint64_t seed = 950;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " tokens " + std::to_string(c.tokens) + " heads " +
                   std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " D " + std::to_string(c.head_dim));
      GemmaRMSNorm norm_gpu(c.head_dim, 1e-6, {dt, kGpu}), norm_cpu(c.head_dim, 1e-6, {dt, kCpu});
      const Pair w = randn({c.head_dim}, dt, seed++, 0.5);
      norm_gpu.weight.copy_(w.gpu);
      norm_cpu.weight.copy_(w.cpu);
      const int64_t D = c.head_dim, width = (c.heads + 2 * c.kv_heads) * D;
      const Pair qkv = randn({c.tokens, width}, dt, seed++);
      for (const bool is_q : {true, false}) {
        const Pair view = qkv_view(qkv, {c.tokens, is_q ? c.heads : c.kv_heads, D}, is_q ? 0 : c.heads * D);
        poison_next_output(view.cpu.shape(), dt);
        expect_close(norm_gpu.forward(view.gpu), norm_cpu.forward(view.cpu), elementwise_tol(dt),
                     is_q ? "gemma q norm" : "gemma k norm");
      }
    }
  }
}

// ---------------------------------------------------------------- rotary_embedding scalings (gpt-oss, Gemma-3)

TEST(RotaryEmbeddingGpu, YarnLinearAndLocalRopesMatchOracle) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    int64_t head_size, num_heads, num_kv_heads, max_position;
    double base;
    RopeScaling scaling;
  };
  RopeScaling yarn;  // gpt-oss-20b
  yarn.rope_type = "yarn";
  yarn.factor = 32.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.truncate = false;
  RopeScaling yarn_truncated = yarn;
  yarn_truncated.truncate = true;
  RopeScaling linear;  // Gemma-3-12B's global layers
  linear.rope_type = "linear";
  linear.factor = 8.0;
  const Case cases[] = {{"gpt-oss yarn", 64, 64, 8, 131072, 150000.0, yarn},
                        {"yarn truncated", 64, 64, 8, 131072, 150000.0, yarn_truncated},
                        {"gemma-3 global linear", 256, 16, 8, 131072, 1e6, linear},
                        {"gemma-3 local", 256, 16, 8, 131072, 10000.0, RopeScaling{}}};
  uint64_t seed = 1000;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      RotaryEmbedding rope_gpu(c.head_size, c.head_size, c.max_position, c.base, true, c.scaling, {dt, kGpu});
      RotaryEmbedding rope_cpu(c.head_size, c.head_size, c.max_position, c.base, true, c.scaling, {dt, kCpu});
      expect_bitwise_equal(rope_gpu.cos_sin_cache, rope_cpu.cos_sin_cache, "cos_sin_cache");
      for (const int64_t tokens : {int64_t(1), int64_t(37), int64_t(300)}) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt) + " tokens " + std::to_string(tokens));
        const int64_t q_size = c.num_heads * c.head_size, kv_size = c.num_kv_heads * c.head_size;
        const Pair qkv = randn({tokens, q_size + 2 * kv_size}, dt, seed++);
        Tensor positions = Tensor::empty({tokens}, DType::i64, kCpu);
        fill_randint_(positions, seed++, 0, c.max_position);
        const Pair pos = from_host(positions);
        const Pair q = qkv.slice(1, 0, q_size), k = qkv.slice(1, q_size, q_size + kv_size);
        rope_gpu.forward(pos.gpu, q.gpu, k.gpu);
        rope_cpu.forward(pos.cpu, q.cpu, k.cpu);
        expect_close(qkv.gpu, qkv.cpu, elementwise_tol(dt), "rotary_embedding qkv");
      }
    }
  }
}

}  // namespace
