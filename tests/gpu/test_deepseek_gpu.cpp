// GPU tests of DeepSeek's ops (issue 18) beyond the op contract (tests/gpu/test_ops_gpu.cpp runs that at
// tiny-deepseek-v2's and DeepSeek-V2-Lite's shapes):
// concat_and_cache_mla's CUDA path against the oracle, bit for bit, on the 16-byte path (DeepSeek-V2's 512 + 64 latent,
// k_pe a view into kv_a_proj_with_mqa's output) and the 2-byte path (an odd latent width and an odd token stride),
// padding tokens skipped, other rows untouched, and a slot outside the cache reported through kbn/device_errors.h with
// that row left unwritten; grouped_topk against the oracle with many tied logits, and a NaN logit reported;
// mla_decode's tensor-core kernels (16, 8 and 128 heads: a partial head group and V3's eight; on Hopper 64, 80 and 128
// heads on the warpgroup-MMA kernel) and its generic kernel against the oracle over ragged lengths (1, 63, 64, 65, long
// ones that split) and page sizes with NaN outside the sequences, and gather_cache bit for bit; fused_mla_rope_cache
// against the four ops it replaces, bit for bit, and its slot error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "L1/concat_and_cache_mla.h"
#include "L1/fused_mla_rope_cache.h"
#include "L1/gather_cache.h"
#include "L1/grouped_topk.h"
#include "L1/mla_decode.h"
#include "L1/rms_norm.h"
#include "L1/rotary_embedding.h"
#include "kbn/compare.h"
#include "kbn/device.h"
#include "kbn/device_errors.h"
#include "kbn/error.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"

using namespace kbn;
using namespace kbn::baseline;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

const Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

Tensor randn(const Shape& shape, uint64_t seed, DType dt) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_normal_(t, seed, 0.0, 1.0);
  return t.to(dt);
}

void expect_bitwise(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  int64_t first = -1;
  const int64_t n = count_bitwise_mismatches(actual.to(kCpu).contiguous(), expected.to(kCpu).contiguous(), &first);
  EXPECT_EQ(n, 0) << what << ": first difference at flat index " << first;
}

struct StoreCase {
  int64_t tokens, L, R, blocks, block_size, extra;  // extra: columns of kv_a beyond the latent (token stride)
  DType dt;
};

TEST(ConcatAndCacheMlaGpu, MatchesTheOracleBitForBit) {
  KBN_SKIP_WITHOUT_GPU();
  for (const StoreCase c : {StoreCase{37, 512, 64, 3, 64, 0, DType::bf16}, StoreCase{37, 512, 64, 3, 64, 0, DType::f32},
                            StoreCase{9, 13, 6, 4, 4, 3, DType::f16}, StoreCase{200, 32, 8, 5, 64, 1, DType::bf16}}) {
    const std::string what = "T=" + std::to_string(c.tokens) + " L=" + std::to_string(c.L) +
                             " R=" + std::to_string(c.R) + " " + dtype_name(c.dt);
    const int64_t W = c.L + c.R, T = c.tokens;
    const Tensor kv_c = randn({T, c.L}, 1, c.dt);
    const Tensor kv_a = randn({T, W + c.extra}, 2, c.dt);  // k_pe: columns L .. L + R of each row
    const Tensor cache = randn({c.blocks, c.block_size, W}, 3, c.dt);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < T; ++t) slots.push_back(t % 5 == 4 ? -1 : (t * 7 + 3) % (c.blocks * c.block_size));
    const Tensor slot_mapping = Tensor::from_i64(slots, {T});
    ConcatAndCacheMLA op;
    Tensor want = cache.clone();
    op.forward(kv_c, kv_a.slice(1, c.L, W), want, slot_mapping);
    Tensor got = cache.to(kGpu);
    const Tensor kv_a_gpu = kv_a.to(kGpu);
    op.forward(kv_c.to(kGpu), kv_a_gpu.slice(1, c.L, W), got, slot_mapping.to(kGpu));
    synchronize(kGpu);
    EXPECT_NO_THROW(check_device_errors()) << what;
    expect_bitwise(got, want, what);
  }
}

TEST(ConcatAndCacheMlaGpu, ASlotOutsideTheCacheIsReported) {
  KBN_SKIP_WITHOUT_GPU();
  const Tensor kv_c = randn({3, 16}, 4, DType::bf16).to(kGpu), k_pe = randn({3, 8}, 5, DType::bf16).to(kGpu);
  const Tensor cache = randn({2, 4, 24}, 6, DType::bf16);
  Tensor got = cache.to(kGpu);
  ConcatAndCacheMLA op;
  op.forward(kv_c, k_pe, got, Tensor::from_i64({1, 8, 2}, {3}).to(kGpu));  // 8 slots: 8 is outside
  synchronize(kGpu);
  try {
    check_device_errors();
    ADD_FAILURE() << "a slot outside the cache was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'slot_mapping'[1]"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_device_errors());
  // Slots 1 and 2 were written, nothing else.
  Tensor want = cache.clone();
  Tensor cpu_kv_c = kv_c.to(kCpu), cpu_k_pe = k_pe.to(kCpu);
  op.forward(cpu_kv_c.slice(0, 0, 1), cpu_k_pe.slice(0, 0, 1), want, Tensor::from_i64({1}, {1}));
  op.forward(cpu_kv_c.slice(0, 2, 3), cpu_k_pe.slice(0, 2, 3), want, Tensor::from_i64({2}, {1}));
  expect_bitwise(got, want, "after an out-of-range slot");
}

// fused_mla_rope_cache gives the bits of what it replaces on the GPU: rms_norm of the latent (the register kernel at
// 512 wide, the one-warp kernel at tiny-deepseek-v2's 32), rotary_embedding (GPT-J pairs) in place on q's rope part
// and on k_pe, concat_and_cache_mla, and the decode tokens' q_pe copied into q_abs. Compared: q, the whole cache and
// q_abs (both poisoned with NaN, so a stray or missed write shows), at DeepSeek-V2-Lite's widths (16 heads of 128 +
// 64, latent 512 + 64), V3's 128 heads and the tiny model's; kv_a rows wider than the latent (a token stride), padding
// tokens (slot -1), a position outside the table (not rotated), all or some or none of the tokens decoding; kv_a must
// be left untouched.
TEST(FusedMlaRopeCacheGpu, SameBitsAsNormRopeStoreAndCopy) {
  KBN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t tokens, decode, heads, nope, rope, rank;
  };
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  const int64_t max_position = 4096, bs = 64, extra = 8;
  uint64_t seed = 900;
  for (const DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const Case c : {Case{1, 1, 16, 128, 64, 512}, Case{37, 20, 16, 128, 64, 512}, Case{5, 5, 128, 128, 64, 512},
                         Case{300, 0, 4, 16, 8, 32}, Case{9, 4, 4, 16, 8, 32}}) {
      ASSERT_TRUE(FusedMlaRopeCache::kernel_supports(dt, c.rank, c.rope));
      const int64_t T = c.tokens, H = c.heads, D = c.nope + c.rope, L = c.rank, R = c.rope, W = L + R;
      const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " decode=" +
                               std::to_string(c.decode) + " heads=" + std::to_string(H) + " L=" + std::to_string(L);
      SCOPED_TRACE(what);
      const Tensor kv_a_rows = randn({T, W + extra}, seed++, dt), q_host = randn({T, H, D}, seed++, dt);
      Tensor positions = Tensor::empty({T}, DType::i64);
      fill_randint_(positions, seed++, 0, max_position);
      if (T > 3) positions.data<int64_t>()[2] = max_position + 5;  // outside the table: not rotated
      const int64_t blocks = T / bs + 2;
      std::vector<int64_t> slots(size_t(blocks * bs));
      std::iota(slots.begin(), slots.end(), 0);
      std::mt19937_64 rng(seed++);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(size_t(T));
      for (size_t t = 1; t < slots.size(); t += 5) slots[t] = -1;
      const Tensor pos = positions.to(kGpu), slot_mapping = Tensor::from_i64(slots, {T}).to(kGpu);
      RotaryEmbedding rope(R, R, max_position, 10000.0, /*is_neox_style=*/false, RopeScaling{}, {dt, kGpu});
      RMSNorm norm(L, 1e-6, {dt, kGpu});
      norm.weight.copy_(randn({L}, seed++, dt).to(kGpu));
      const auto poisoned = [&](const Shape& shape) { return Tensor::full(shape, kNaN, dt, kGpu); };

      const Tensor kv_a = kv_a_rows.to(kGpu).slice(1, 0, W), q = q_host.to(kGpu);
      const Tensor cache = poisoned({blocks, bs, W});
      const Tensor q_abs = c.decode > 0 ? poisoned({c.decode, H, W}) : Tensor();
      FusedMlaRopeCache(H, c.nope, R, L, 1e-6)
          .forward(kv_a, q, pos, rope.cos_sin_cache, norm.weight, cache, slot_mapping, q_abs);
      synchronize(kGpu);
      EXPECT_NO_THROW(check_device_errors());
      expect_bitwise(kv_a, kv_a_rows.slice(1, 0, W), "kv_a must be left untouched");

      const Tensor kv_a2 = kv_a_rows.to(kGpu).slice(1, 0, W), q2 = q_host.to(kGpu);
      const Tensor cache2 = poisoned({blocks, bs, W});
      const Tensor q_abs2 = c.decode > 0 ? poisoned({c.decode, H, W}) : Tensor();
      const Tensor normed = norm.forward(kv_a2.slice(1, 0, L));
      const Tensor k_pe = kv_a2.slice(1, L, W);
      rope.forward(pos, q2.slice(2, c.nope, D), k_pe);
      ConcatAndCacheMLA().forward(normed, k_pe, cache2, slot_mapping);
      if (c.decode > 0) q_abs2.slice(2, L, W).copy_(q2.slice(0, T - c.decode, T).slice(2, c.nope, D));
      expect_bitwise(q, q2, "q");
      expect_bitwise(cache, cache2, "the latent cache");
      if (c.decode > 0) expect_bitwise(q_abs, q_abs2, "q_abs");
    }
}

TEST(FusedMlaRopeCacheGpu, ASlotOutsideTheCacheIsReported) {
  KBN_SKIP_WITHOUT_GPU();
  const int64_t L = 32, R = 8, W = L + R, H = 2, P = 16;
  const Tensor kv_a = randn({3, W}, 7, DType::bf16).to(kGpu), q = randn({3, H, P + R}, 8, DType::bf16).to(kGpu);
  RotaryEmbedding rope(R, R, 64, 10000.0, false, RopeScaling{}, {DType::bf16, kGpu});
  const Tensor weight = randn({L}, 9, DType::bf16).to(kGpu), cache = Tensor::zeros({2, 4, W}, DType::bf16, kGpu);
  FusedMlaRopeCache(H, P, R, L, 1e-6)
      .forward(kv_a, q, Tensor::from_i64({0, 1, 2}, {3}).to(kGpu), rope.cos_sin_cache, weight, cache,
               Tensor::from_i64({1, 8, 2}, {3}).to(kGpu));  // 8 slots: 8 is outside
  synchronize(kGpu);
  try {
    check_device_errors();
    ADD_FAILURE() << "a slot outside the cache was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_mla_rope_cache: argument 'slot_mapping'[1]"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_device_errors());
  const std::vector<double> rows = cache.to(kCpu).to_doubles();
  for (int64_t slot = 0; slot < 8; ++slot) {
    bool written = false;
    for (int64_t i = 0; i < W; ++i) written = written || rows[size_t(slot * W + i)] != 0.0;
    EXPECT_EQ(written, slot == 1 || slot == 2) << "slot " << slot;
  }
}

TEST(GroupedTopkGpu, TiesAndGroupsMatchTheOracle) {
  KBN_SKIP_WITHOUT_GPU();
  // V3's router at 256 experts in 8 groups, and Lite's greedy softmax; logits with many exact ties (a few levels).
  for (const bool v3 : {true, false}) {
    const int64_t T = 300, E = v3 ? 256 : 64, k = v3 ? 8 : 6;
    std::vector<float> levels(size_t(T * E));
    for (size_t i = 0; i < levels.size(); ++i) levels[i] = float(int64_t((i * 2654435761u) % 7) - 3) * 0.5f;
    const Tensor logits = Tensor::from_floats(levels, {T, E}).to(DType::bf16);
    const Tensor bias = v3 ? randn({E}, 7, DType::f32) : Tensor();
    GroupedTopk op(k, v3, v3 ? 8 : 1, v3 ? 4 : 1, v3 ? "sigmoid" : "softmax", v3 ? 2.5 : 1.0);
    const auto [want_w, want_ids] = op.forward(logits, bias);
    const auto [got_w, got_ids] = op.forward(logits.to(kGpu), v3 ? bias.to(kGpu) : Tensor());
    synchronize(kGpu);
    EXPECT_NO_THROW(check_device_errors());
    expect_bitwise(got_ids, want_ids, v3 ? "V3 ids" : "Lite ids");
    const CompareStats s = compare_close(got_w.to(kCpu), want_w, Tolerance{1e-6, 1e-6, 0});
    EXPECT_EQ(s.bad, 0) << s.describe();
  }
}

TEST(GroupedTopkGpu, ANanLogitIsReported) {
  KBN_SKIP_WITHOUT_GPU();
  std::vector<float> v(2 * 16, 0.5f);
  v[16 + 3] = std::numeric_limits<float>::quiet_NaN();
  GroupedTopk op(2, true, 4, 2, "softmax", 1.0);
  op.forward(Tensor::from_floats(v, {2, 16}).to(kGpu), Tensor());
  synchronize(kGpu);
  try {
    check_device_errors();
    ADD_FAILURE() << "a NaN logit was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN in token 1"), std::string::npos) << e.what();
  }
}

// Ragged sequences over a scattered latent cache of block_size 16; lengths cover empty, one key, the 64-key tile
// edges and ones long enough to split.
struct LatentBatch {
  Tensor cache, tables, lens;
  int64_t max_len = 0;
};

LatentBatch latent_batch(const std::vector<int32_t>& lens, int64_t W, DType dt, uint64_t seed) {
  const int64_t bs = 16, S = int64_t(lens.size());
  int64_t bps = 1;
  LatentBatch b;
  for (int32_t n : lens) {
    bps = std::max<int64_t>(bps, (n + bs - 1) / bs);
    b.max_len = std::max<int64_t>(b.max_len, n);
  }
  const int64_t blocks = S * bps + 3;
  std::vector<int32_t> table(size_t(S * bps));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 7 + 2) % size_t(blocks));
  b.cache = randn({blocks, bs, W}, seed, dt);
  b.tables = Tensor::from_i32(table, {S, bps});
  b.lens = Tensor::from_i32(lens, {S});
  return b;
}

TEST(MlaDecodeGpu, KernelsMatchTheOracleOverRaggedLengths) {
  KBN_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> lens{1, 63, 64, 65, 1000, 4099, 17, 2};  // a decode query sees at least its own row
  struct Case {
    int64_t heads, L, R;
    DType dt;
  };
  // 512 + 64 in 16 bits: the tensor-core kernels (8 heads: half a group; 128: V3; on Hopper 64 or more heads take the
  // warpgroup-MMA kernel: 64 in f16, 80 = a whole and a partial 64-head tile); the rest: the generic kernel.
  for (const Case c : {Case{16, 512, 64, DType::bf16}, Case{8, 512, 64, DType::f16}, Case{128, 512, 64, DType::bf16},
                       Case{64, 512, 64, DType::f16}, Case{80, 512, 64, DType::bf16}, Case{16, 512, 64, DType::f32},
                       Case{4, 32, 8, DType::bf16}}) {
    const std::string what =
        std::to_string(c.heads) + " heads " + std::to_string(c.L) + "+" + std::to_string(c.R) + " " + dtype_name(c.dt);
    const int64_t W = c.L + c.R, S = int64_t(lens.size());
    const LatentBatch b = latent_batch(lens, W, c.dt, 11);
    const Tensor q = randn({S, c.heads, W}, 12, c.dt);
    MlaDecode op(c.heads, c.L, c.R, 0.07);
    const Tensor want = op.forward(q, b.cache, b.lens, b.tables, b.max_len);
    for (const int64_t max_len : {b.max_len, int64_t(8192)}) {  // the grid sized for the batch, and for more
      const Tensor got = op.forward(q.to(kGpu), b.cache.to(kGpu), b.lens.to(kGpu), b.tables.to(kGpu), max_len);
      synchronize(kGpu);
      const Tolerance tol = c.dt == DType::f32 ? Tolerance{1e-4, 1e-4, 0} : Tolerance{2e-2, 2e-2, 0};
      const CompareStats st = compare_close(got.to(kCpu).to(DType::f32), want.to(DType::f32), tol);
      EXPECT_EQ(st.bad, 0) << what << " max_len " << max_len << ": " << st.describe();
    }
  }
}

// Pages of 1, 16, 64 and 128 rows (every row its own lookup; four pages a tile; a tile one page; half a page), for 16
// and 128 heads, and a cache whose rows outside the sequences are NaN: no kernel may read them, and the rows of a
// partial tile that the Hopper kernels do not copy (or copy from past the sequence) must not reach P V (0 x NaN).
// Sequences short enough that their only tile is partial.
TEST(MlaDecodeGpu, PageSizesAndNaNOutsideTheSequences) {
  KBN_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> lens{5, 64, 130, 1, 700};
  const int64_t W = 576, S = int64_t(lens.size());
  for (const int64_t heads : {int64_t(16), int64_t(128)})
    for (const int64_t bs : {int64_t(1), int64_t(16), int64_t(64), int64_t(128)}) {
      int64_t bps = 1, max_len = 0;
      for (int32_t n : lens) {
        bps = std::max<int64_t>(bps, (n + bs - 1) / bs);
        max_len = std::max<int64_t>(max_len, n);
      }
      const int64_t blocks = S * bps + 5;
      std::vector<int32_t> table(size_t(S * bps));
      for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 5 + 3) % size_t(blocks));
      // Every row NaN, then each sequence's rows from a random tensor.
      Tensor cache = Tensor::full({blocks, bs, W}, std::nan(""), DType::bf16);
      const Tensor rows = randn({blocks, bs, W}, 21, DType::bf16);
      for (int64_t s = 0; s < S; ++s)
        for (int64_t key = 0; key < lens[size_t(s)]; ++key) {
          const int64_t blk = table[size_t(s * bps + key / bs)], slot = key % bs;
          cache.select(0, blk).select(0, slot).copy_(rows.select(0, blk).select(0, slot));
        }
      const Tensor tables = Tensor::from_i32(table, {S, bps}), seq_lens = Tensor::from_i32(lens, {S});
      const Tensor q = randn({S, heads, W}, 22, DType::bf16);
      MlaDecode op(heads, 512, 64, 0.07);
      const Tensor want = op.forward(q, cache, seq_lens, tables, max_len);
      for (const int64_t grid_len : {max_len, int64_t(4096)}) {
        const Tensor got = op.forward(q.to(kGpu), cache.to(kGpu), seq_lens.to(kGpu), tables.to(kGpu), grid_len);
        synchronize(kGpu);
        const CompareStats st = compare_close(got.to(kCpu).to(DType::f32), want.to(DType::f32), {2e-2, 2e-2, 0});
        EXPECT_EQ(st.bad, 0) << heads << " heads, block_size " << bs << " max_len " << grid_len << ": "
                             << st.describe();
      }
    }
}

TEST(GatherCacheGpu, MatchesTheOracleBitForBitAndReportsABadLength) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t W : {int64_t(576), int64_t(21)}) {  // 16-byte rows, and 2-byte units
    const LatentBatch b = latent_batch({5, 0, 130, 64}, W, DType::bf16, 13);
    GatherCache op;
    const Tensor want = op.forward(b.cache, b.tables, b.lens, 140);
    const Tensor got = op.forward(b.cache.to(kGpu), b.tables.to(kGpu), b.lens.to(kGpu), 140);
    synchronize(kGpu);
    EXPECT_NO_THROW(check_device_errors());
    expect_bitwise(got, want, "gather_cache W=" + std::to_string(W));
  }
  const LatentBatch b = latent_batch({5, 300}, 24, DType::bf16, 14);
  GatherCache op;
  op.forward(b.cache.to(kGpu), b.tables.to(kGpu), b.lens.to(kGpu), 100);  // 300 > max_seq_len
  synchronize(kGpu);
  try {
    check_device_errors();
    ADD_FAILURE() << "a length past max_seq_len was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'seq_lens'[1]"), std::string::npos) << e.what();
  }
}

}  // namespace
