// GPU tests of the paged attention kernels (FlashAttnPrefill, FlashAttnDecode): each case runs the op on CUDA
// tensors and on the same CPU tensors, where the op calls the reference oracle (fp64), and compares.
//
// Tolerance: max |gpu - oracle| <= tol * max |oracle| over the whole output, tol = 2e-2 for bf16 and 1e-2 for f16.
// The kernels accumulate in fp32 but round the softmax probabilities P to the input dtype before the P V product
// (as FlashAttention does), and the output once more; both are far below these bounds.
//
// Every GPU output lands on memory poisoned with NaN (checked), so an element the kernel forgets fails the
// comparison. Caches are NaN everywhere except the slots holding real keys, and block-table padding points at a
// NaN block, so reading past a sequence's keys poisons the result too. Sizes stay small where the oracle runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "kbn/allocator.h"
#include "kbn/device.h"
#include "kbn/error.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"

using kbn::Device;
using kbn::DType;
using kbn::KVScales;
using kbn::Tensor;
using kbn::baseline::FlashAttnDecode;
using kbn::baseline::FlashAttnPrefill;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!kbn::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double tolerance(DType dt) { return dt == DType::bf16 ? 2e-2 : dt == DType::f16 ? 1e-2 : 1e-5; }

// What to build: sequence b has q_lens[b] new tokens at the end of its seq_lens[b] keys (decode: q_lens all 1).
struct BatchSpec {
  int64_t num_heads = 8, num_kv_heads = 8, head_size = 128, block_size = 16;
  DType dtype = DType::bf16;
  DType cache_dtype = DType::f32;  // f32 here: the pages take `dtype`; fp8e4m3: --kv-cache-dtype fp8_e4m3 pages
  std::vector<int> q_lens, seq_lens;
  uint64_t seed = 1;
  float q_std = 1.5f;  // logits ~ N(0, q_std^2) with scale 1/sqrt(head_size): a softmax neither flat nor one-hot
  KVScales kv_scales;  // fp8 pages' per-tensor k_scale / v_scale (1.0: none); the oracle reads e * scale
};

// A paged batch on the host.
struct PagedBatch {
  Tensor q;                // [num_tokens, num_heads, head_size]
  Tensor key_cache;        // [num_blocks, block_size, num_kv_heads, head_size]
  Tensor value_cache;      // [num_blocks, block_size, num_kv_heads, head_size]
  Tensor query_start_loc;  // [num_seqs + 1] i32
  Tensor seq_lens;         // [num_seqs] i32
  Tensor block_tables;     // [num_seqs, max_blocks_per_seq] i32
  std::vector<int> table;  // block_tables, row-major
  int64_t max_blocks_per_seq = 0;
  int64_t max_query_len = 0, max_seq_len = 0;
};

// Physical blocks are a random permutation (sequences' pages interleave out of order); unused slots of the last
// page and two spare blocks hold NaN; each block-table row has at least one padding entry pointing at a spare.
PagedBatch make_batch(const BatchSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t num_seqs = int64_t(s.seq_lens.size());
  PagedBatch b;
  int64_t used_blocks = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    used_blocks += ceil_div(s.seq_lens[size_t(i)], s.block_size);
    b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, ceil_div(s.seq_lens[size_t(i)], s.block_size) + 1);
    b.max_seq_len = std::max<int64_t>(b.max_seq_len, s.seq_lens[size_t(i)]);
    b.max_query_len = std::max<int64_t>(b.max_query_len, s.q_lens[size_t(i)]);
  }
  const int64_t num_blocks = used_blocks + 2;
  std::vector<int> physical(static_cast<size_t>(num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);

  const int64_t row = s.num_kv_heads * s.head_size;  // elements per key slot
  std::vector<float> keys(size_t(num_blocks * s.block_size * row), kNaN), values(keys.size(), kNaN);
  b.table.assign(size_t(num_seqs * b.max_blocks_per_seq), physical.back());
  size_t next = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t len = s.seq_lens[size_t(i)];
    for (int64_t j = 0; j < ceil_div(len, s.block_size); ++j)
      b.table[size_t(i * b.max_blocks_per_seq + j)] = physical[next++];
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t block = b.table[size_t(i * b.max_blocks_per_seq + pos / s.block_size)];
      const size_t at = size_t((block * s.block_size + pos % s.block_size) * row);
      for (int64_t e = 0; e < row; ++e) {
        keys[at + size_t(e)] = normal(rng);
        values[at + size_t(e)] = normal(rng);
      }
    }
  }
  const kbn::Shape cache_shape{num_blocks, s.block_size, s.num_kv_heads, s.head_size};
  const DType pages = s.cache_dtype == DType::fp8e4m3 ? DType::fp8e4m3 : s.dtype;
  b.key_cache = Tensor::from_floats(keys, cache_shape, pages);
  b.value_cache = Tensor::from_floats(values, cache_shape, pages);
  b.block_tables = Tensor::from_i32(b.table, {num_seqs, b.max_blocks_per_seq});
  b.seq_lens = Tensor::from_i32(s.seq_lens, {num_seqs});
  std::vector<int> starts{0};
  for (int len : s.q_lens) starts.push_back(starts.back() + len);
  b.query_start_loc = Tensor::from_i32(starts, {num_seqs + 1});

  std::vector<float> q(size_t(starts.back() * s.num_heads * s.head_size));
  for (float& v : q) v = s.q_std * normal(rng);
  b.q = Tensor::from_floats(q, {starts.back(), s.num_heads, s.head_size}, s.dtype);
  return b;
}

// q[t, h, :] = gain * K[key_of(seq, position of t, h), h / group, :], read back from the cache (so exact): the
// chosen key dominates its row's softmax, which pins the attended key range exactly (an off-by-one at a mask or
// split boundary changes the output completely instead of by 1/seq_len).
void align_queries_with_keys(PagedBatch& b, const BatchSpec& s, const std::function<int(int, int, int)>& key_of,
                             float gain) {
  const std::vector<float> keys = b.key_cache.to_floats();
  std::vector<float> q = b.q.to_floats();
  const int64_t group = s.num_heads / s.num_kv_heads;
  int64_t token = 0;
  for (size_t i = 0; i < s.seq_lens.size(); ++i) {
    for (int j = 0; j < s.q_lens[i]; ++j, ++token) {
      const int pos = s.seq_lens[i] - s.q_lens[i] + j;
      for (int64_t h = 0; h < s.num_heads; ++h) {
        const int key = key_of(int(i), pos, int(h));
        const int64_t block = b.table[i * size_t(b.max_blocks_per_seq) + size_t(key / s.block_size)];
        const size_t src =
            size_t(((block * s.block_size + key % s.block_size) * s.num_kv_heads + h / group) * s.head_size);
        const size_t dst = size_t((token * s.num_heads + h) * s.head_size);
        for (int64_t d = 0; d < s.head_size; ++d) q[dst + size_t(d)] = gain * keys[src + size_t(d)];
      }
    }
  }
  b.q = Tensor::from_floats(q, b.q.shape(), s.dtype);
}

struct DeviceBatch {
  Tensor q, key_cache, value_cache, query_start_loc, seq_lens, block_tables;
};

DeviceBatch to_device(const PagedBatch& b) {
  const Device dev = Device::cuda();
  return {b.q.to(dev),        b.key_cache.to(dev),   b.value_cache.to(dev), b.query_start_loc.to(dev),
          b.seq_lens.to(dev), b.block_tables.to(dev)};
}

// Leaves exactly one free cached block of the output's size, filled with NaN, so that the op's output allocation
// (its first on the device) lands on it. Returns the block's address for the caller to confirm.
void* poison_next_output(const Tensor& like) {
  kbn::cuda_empty_cache();
  Tensor poison = Tensor::empty(like.shape(), like.dtype(), Device::cuda());
  poison.fill_(std::numeric_limits<double>::quiet_NaN());
  return poison.data_ptr();
}

void expect_matches_oracle(const Tensor& gpu, const Tensor& oracle, DType dt, const std::string& what) {
  ASSERT_TRUE(gpu.is_cuda()) << what;
  ASSERT_EQ(gpu.shape(), oracle.shape()) << what;
  ASSERT_EQ(gpu.dtype(), dt) << what;
  const std::vector<float> g = gpu.to_floats(), r = oracle.to_floats();
  double scale = 0;
  for (float v : r) scale = std::max(scale, double(std::fabs(v)));
  ASSERT_TRUE(std::isfinite(scale) && scale > 0) << what << ": the oracle output is degenerate";
  const int64_t heads = gpu.size(1), dims = gpu.size(2);
  size_t nonfinite = 0, worst = 0;
  double max_err = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      if (nonfinite++ == 0) worst = i;
      continue;
    }
    const double err = std::fabs(double(g[i]) - double(r[i]));
    if (err > max_err && nonfinite == 0) {
      max_err = err;
      worst = i;
    }
  }
  const auto where = [&](size_t i) {
    std::ostringstream os;
    os << "[row " << int64_t(i) / (heads * dims) << ", head " << int64_t(i) / dims % heads << ", dim "
       << int64_t(i) % dims << "]";
    return os.str();
  };
  EXPECT_EQ(nonfinite, 0u) << what << ": " << nonfinite << " of " << g.size()
                           << " outputs are not finite (unwritten or poisoned), first at " << where(worst);
  EXPECT_LE(max_err, tolerance(dt) * scale)
      << what << ": max |gpu - oracle| = " << max_err << " at " << where(worst) << " (gpu " << g[worst] << ", oracle "
      << r[worst] << "), output scale " << scale;
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  ASSERT_EQ(ha.nbytes(), hb.nbytes()) << what;
  EXPECT_EQ(std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()), 0) << what << ": two runs differ";
}

std::string describe(const BatchSpec& s, const char* name) {
  std::ostringstream os;
  os << name << " " << kbn::dtype_name(s.dtype) << " heads " << s.num_heads << "/" << s.num_kv_heads << " head_size "
     << s.head_size << " block_size " << s.block_size << " k/v scales " << s.kv_scales.k << "/" << s.kv_scales.v
     << " seqs (q/kv):";
  for (size_t i = 0; i < s.seq_lens.size(); ++i) os << " " << s.q_lens[i] << "/" << s.seq_lens[i];
  return os.str();
}

// ---- prefill ----

// Runs the op on the GPU (poisoned output, twice for determinism) and on the CPU oracle, and compares.
void check_prefill(const BatchSpec& s, PagedBatch b) {
  const std::string what = describe(s, "flash_attn_prefill");
  FlashAttnPrefill op(s.num_heads, s.head_size, 1.0 / std::sqrt(double(s.head_size)), s.num_kv_heads);
  const DeviceBatch d = to_device(b);
  void* poisoned = poison_next_output(d.q);
  const Tensor gpu = op.forward(d.q, d.key_cache, d.value_cache, d.query_start_loc, d.seq_lens, d.block_tables,
                                b.max_query_len, b.max_seq_len, s.kv_scales);
  EXPECT_EQ(gpu.data_ptr(), poisoned) << what << ": the output did not land on the NaN-poisoned block";
  const Tensor again = op.forward(d.q, d.key_cache, d.value_cache, d.query_start_loc, d.seq_lens, d.block_tables,
                                  b.max_query_len, b.max_seq_len, s.kv_scales);
  const Tensor oracle = op.forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables,
                                   b.max_query_len, b.max_seq_len, s.kv_scales);
  expect_matches_oracle(gpu, oracle, s.dtype, what);
  expect_bitwise_equal(gpu, again, what);
}

void check_prefill(const BatchSpec& s) { check_prefill(s, make_batch(s)); }

TEST(FlashAttnPrefillGpu, SingleSequence) {
  KBN_SKIP_WITHOUT_GPU();
  check_prefill({.num_heads = 8,
                 .num_kv_heads = 8,
                 .head_size = 128,
                 .block_size = 16,
                 .dtype = DType::bf16,
                 .q_lens = {200},
                 .seq_lens = {200}});
}

TEST(FlashAttnPrefillGpu, VarlenBatchGqa32x8) {
  KBN_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16}) {
    check_prefill({.num_heads = 32,
                   .num_kv_heads = 8,
                   .head_size = 128,
                   .block_size = 16,
                   .dtype = dt,
                   .q_lens = {1, 17, 129, 300},
                   .seq_lens = {1, 17, 129, 300},
                   .seed = 2});
  }
}

TEST(FlashAttnPrefillGpu, ChunkedPrefillWithCachedContext) {
  KBN_SKIP_WITHOUT_GPU();
  // Context 100 + 37 new tokens; a fresh 50-token prompt; one new token after 500 cached.
  check_prefill({.num_heads = 32,
                 .num_kv_heads = 8,
                 .head_size = 128,
                 .block_size = 16,
                 .dtype = DType::bf16,
                 .q_lens = {37, 50, 1},
                 .seq_lens = {137, 50, 501},
                 .seed = 3});
}

TEST(FlashAttnPrefillGpu, Gqa4x1Head64Block32F16) {
  KBN_SKIP_WITHOUT_GPU();
  check_prefill({.num_heads = 4,
                 .num_kv_heads = 1,
                 .head_size = 64,
                 .block_size = 32,
                 .dtype = DType::f16,
                 .q_lens = {17, 1, 300, 129, 5},
                 .seq_lens = {17, 31, 300, 136, 69},
                 .seed = 4});
}

// Heads 192 (DeepSeek MLA's decompressed prefill: 16 heads, no GQA) and 256 (Gemma-3-12B: 16 query heads per 8 kv
// heads) on Hopper's wgmma kernel: 64-key tiles, O of 64 x head_size per warpgroup. Varlen with a cached context, more
// query tiles than blocks (persistent grid, next item's Q prefetched), pages of 16, 32 and 64 keys (tensor-map boxes),
// and 128-key pages, which the 64-key tile cannot hold: the mma.sync fallback.
TEST(FlashAttnPrefillGpu, Heads192And256VarlenAndPageSizes) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t head_size : {192, 256}) {
    for (const int64_t bs : {16, 32, 64, 128}) {
      for (const DType dt : {DType::bf16, DType::f16}) {
        check_prefill({.num_heads = 16,
                       .num_kv_heads = head_size == 192 ? 16 : 8,
                       .head_size = head_size,
                       .block_size = bs,
                       .dtype = dt,
                       .q_lens = {1, 65, 150, 37},
                       .seq_lens = {1, 65, 213, 300},
                       .seed = uint64_t(40 + bs + head_size)});
      }
    }
  }
}

// Values narrower than keys (DeepSeek's MLA prefill: keys 192, values 128): Hopper's kernel at 16-bit pages it can
// copy, the generic kernel for f32 and for pages of 128; each against the oracle on the same narrow values, and the
// oracle against itself on values zero-padded to 192 (the layout this path replaces).
TEST(FlashAttnPrefillGpu, ValuesNarrowerThanKeys) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t bs : {16, 64, 128}) {
    for (const DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const BatchSpec s{.num_heads = 16,
                        .num_kv_heads = 16,
                        .head_size = 192,
                        .block_size = bs,
                        .dtype = dt,
                        .q_lens = {1, 65, 150, 37},
                        .seq_lens = {1, 65, 213, 300},
                        .seed = uint64_t(90 + bs)};
      const std::string what = describe(s, "flash_attn_prefill") + " values 128";
      PagedBatch b = make_batch(s);
      const Tensor narrow = b.value_cache.slice(3, 0, 128).contiguous();
      Tensor padded = Tensor::zeros(b.value_cache.shape(), b.value_cache.dtype());
      padded.slice(3, 0, 128).copy_(narrow);
      FlashAttnPrefill op(s.num_heads, s.head_size, 1.0 / std::sqrt(192.0), s.num_kv_heads);
      const Tensor oracle = op.forward(b.q, b.key_cache, narrow, b.query_start_loc, b.seq_lens, b.block_tables,
                                       b.max_query_len, b.max_seq_len);
      ASSERT_EQ(oracle.size(2), 128) << what;
      const Tensor oracle_padded = op.forward(b.q, b.key_cache, padded, b.query_start_loc, b.seq_lens, b.block_tables,
                                              b.max_query_len, b.max_seq_len);
      expect_bitwise_equal(oracle, oracle_padded.slice(2, 0, 128).contiguous(), what + " (oracle, padded)");
      b.value_cache = narrow;
      const DeviceBatch d = to_device(b);
      const Tensor gpu = op.forward(d.q, d.key_cache, d.value_cache, d.query_start_loc, d.seq_lens, d.block_tables,
                                    b.max_query_len, b.max_seq_len);
      ASSERT_EQ(gpu.size(2), 128) << what;
      expect_matches_oracle(gpu, oracle, dt, what);
    }
  }
  const bool hopper = FlashAttnPrefill::value_width_on_tensor_cores(DType::bf16, 192, 128, Device::cuda());
  std::printf("values 128 / keys 192 on tensor cores here: %s\n", hopper ? "yes (Hopper)" : "no (generic kernel)");
}

TEST(FlashAttnPrefillGpu, NoGqaHead64Block32) {
  KBN_SKIP_WITHOUT_GPU();
  check_prefill({.num_heads = 8,
                 .num_kv_heads = 8,
                 .head_size = 64,
                 .block_size = 32,
                 .dtype = DType::bf16,
                 .q_lens = {129, 300},
                 .seq_lens = {129, 400},
                 .seed = 5});
}

TEST(FlashAttnPrefillGpu, LargeBlocks) {
  KBN_SKIP_WITHOUT_GPU();
  for (int64_t block_size : {64, 128}) {
    check_prefill({.num_heads = 8,
                   .num_kv_heads = 2,
                   .head_size = 128,
                   .block_size = block_size,
                   .dtype = DType::bf16,
                   .q_lens = {70, 130},
                   .seq_lens = {200, 130},
                   .seed = 6});
  }
}

TEST(FlashAttnPrefillGpu, PageSizesTmaCannotCopyRunTheFallback) {
  KBN_SKIP_WITHOUT_GPU();
  // The Hopper kernel copies whole pages as tensor-map boxes (8..128 keys dividing its 128-key tile); other page
  // sizes take the mma.sync kernel on every GPU.
  for (int64_t block_size : {4, 24}) {
    check_prefill({.num_heads = 32,
                   .num_kv_heads = 8,
                   .head_size = 128,
                   .block_size = block_size,
                   .dtype = DType::bf16,
                   .q_lens = {100, 7},
                   .seq_lens = {150, 7},
                   .seed = 11});
  }
}

TEST(FlashAttnPrefillGpu, ManySequencesMoreTilesThanBlocks) {
  KBN_SKIP_WITHOUT_GPU();
  // ~1300 query tiles over varlen, partly cached sequences: each block of the persistent Hopper kernel walks about
  // ten work items of different sequences and lengths (Q prefetched across items, the K/V ring running on).
  BatchSpec s{.num_heads = 32, .num_kv_heads = 8, .head_size = 128, .block_size = 16, .dtype = DType::bf16, .seed = 12};
  for (int i = 0; i < 32; ++i) {
    const int q = 1 + (i * 211) % 300;
    s.q_lens.push_back(q);
    s.seq_lens.push_back(q + (i % 3 == 0 ? (i * 37) % 300 : 0));
  }
  check_prefill(s);
}

TEST(FlashAttnPrefillGpu, GroupLargerThanOneWarpOfRows) {
  KBN_SKIP_WITHOUT_GPU();
  // 20 query heads per kv head: packed rows (token, head) do not align with warps or query tiles.
  check_prefill({.num_heads = 20,
                 .num_kv_heads = 1,
                 .head_size = 64,
                 .block_size = 16,
                 .dtype = DType::bf16,
                 .q_lens = {9, 40},
                 .seq_lens = {40, 40},
                 .seed = 7});
}

TEST(FlashAttnPrefillGpu, CausalBoundaryIsExact) {
  KBN_SKIP_WITHOUT_GPU();
  // Even heads look for their own position's key (must be seen), odd heads for the next one (must be masked); at the
  // wgmma head sizes (128- and 64-key tiles).
  for (const int64_t head_size : {64, 128, 192, 256}) {
    const BatchSpec s{.num_heads = 4,
                      .num_kv_heads = 2,
                      .head_size = head_size,
                      .block_size = 16,
                      .dtype = DType::bf16,
                      .q_lens = {70, 64},
                      .seq_lens = {110, 64},
                      .seed = 8};
    PagedBatch b = make_batch(s);
    align_queries_with_keys(
        b, s, [&](int seq, int pos, int h) { return h % 2 == 0 ? pos : std::min(pos + 1, s.seq_lens[seq] - 1); },
        2.f);
    check_prefill(s, b);
  }
}

TEST(FlashAttnPrefillGpu, EmptyBatchLaunchesNothing) {
  KBN_SKIP_WITHOUT_GPU();
  const Device dev = Device::cuda();
  FlashAttnPrefill op(8, 128, 0.088, 2);
  const Tensor q = Tensor::empty({0, 8, 128}, DType::bf16, dev);
  const Tensor cache = Tensor::zeros({4, 16, 2, 128}, DType::bf16, dev);
  const Tensor query_start_loc = Tensor::from_i32({0}, {1}).to(dev);
  const Tensor out = op.forward(q, cache, cache, query_start_loc, Tensor::empty({0}, DType::i32, dev),
                                Tensor::empty({0, 1}, DType::i32, dev), 0, 0);
  EXPECT_EQ(out.shape(), (kbn::Shape{0, 8, 128}));
  EXPECT_TRUE(out.is_cuda());
}

TEST(FlashAttnPrefillGpu, GenericKernelCoversOtherHeadSizesAndF32) {
  KBN_SKIP_WITHOUT_GPU();
  // Head sizes without a tensor-core kernel, and f32, run on the generic kernel.
  check_prefill({.num_heads = 4,
                 .num_kv_heads = 2,
                 .head_size = 96,
                 .block_size = 16,
                 .dtype = DType::bf16,
                 .q_lens = {5, 40},
                 .seq_lens = {20, 40},
                 .seed = 9});
  check_prefill({.num_heads = 4,
                 .num_kv_heads = 1,
                 .head_size = 16,
                 .block_size = 16,
                 .dtype = DType::f32,
                 .q_lens = {33, 1},
                 .seq_lens = {50, 7},
                 .seed = 10});
}

TEST(FlashAttnPrefillGpu, UnsupportedHeadSizeNamesTheSupportedSet) {
  KBN_SKIP_WITHOUT_GPU();
  const BatchSpec s{
      .num_heads = 2, .num_kv_heads = 2, .head_size = 320, .block_size = 16, .q_lens = {4}, .seq_lens = {4}};
  const PagedBatch b = make_batch(s);
  const DeviceBatch d = to_device(b);
  FlashAttnPrefill op(2, 320, 0.1, 2);
  try {
    op.forward(d.q, d.key_cache, d.value_cache, d.query_start_loc, d.seq_lens, d.block_tables, 4, 4);
    FAIL() << "head_size 320 should be refused on CUDA";
  } catch (const kbn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("any size up to 256"), std::string::npos) << e.what();
  }
}

// ---- decode ----

void check_decode(const BatchSpec& s, PagedBatch b) {
  const std::string what = describe(s, "flash_attn_decode");
  FlashAttnDecode op(s.num_heads, s.head_size, 1.0 / std::sqrt(double(s.head_size)), s.num_kv_heads);
  const DeviceBatch d = to_device(b);
  void* poisoned = poison_next_output(d.q);
  const Tensor gpu = op.forward(d.q, d.key_cache, d.value_cache, d.seq_lens, d.block_tables, b.max_seq_len, s.kv_scales);
  EXPECT_EQ(gpu.data_ptr(), poisoned) << what << ": the output did not land on the NaN-poisoned block";
  const Tensor again =
      op.forward(d.q, d.key_cache, d.value_cache, d.seq_lens, d.block_tables, b.max_seq_len, s.kv_scales);
  const Tensor oracle =
      op.forward(b.q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, b.max_seq_len, s.kv_scales);
  expect_matches_oracle(gpu, oracle, s.dtype, what);
  expect_bitwise_equal(gpu, again, what);
}

BatchSpec decode_spec(BatchSpec s) {
  s.q_lens.assign(s.seq_lens.size(), 1);
  return s;
}

void check_decode(const BatchSpec& s) { check_decode(s, make_batch(s)); }

// `count` lengths uniform in [1, max_len], then the `extra` lengths (the long ones that force several splits).
std::vector<int> random_lengths(int count, int max_len, std::vector<int> extra, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> len(1, max_len);
  std::vector<int> out;
  for (int i = 0; i < count; ++i) out.push_back(len(rng));
  out.insert(out.end(), extra.begin(), extra.end());
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// ---- decode over fp8 e4m3 pages (--kv-cache-dtype fp8_e4m3) under bf16 and f16 queries: on Hopper the tensor-core
// kernel (each tile widened to f16 in shared memory, f16 mmas, bf16 q rounded to f16), elsewhere the generic kernel;
// the oracle reads the same fp8 pages on the CPU. Tolerance as for 16-bit pages, tolerance(q's dtype): the pages are
// exact in f16, q's bf16 values are exact in f16 at these magnitudes (~N(0, 1.5^2), far inside f16's normal range),
// and P is rounded to f16 (11 bits, finer than the 8 of bf16 P on 16-bit bf16 pages), so the error is the output's
// rounding to q's dtype plus P's, as with 16-bit pages; a widening or layout bug is off by O(1) ----

TEST(FlashAttnDecodeGpu, Fp8PagesBatch1LongContextSplitsKeys) {
  KBN_SKIP_WITHOUT_GPU();
  // One sequence, several splits and the reduce. Head 64 with group 4 (16-byte cp.async of 64-byte rows), head 128
  // with group 1 (128-byte rows, cp.async), head 256 with group 16 (256-byte rows by bulk copies, Q in shared memory).
  struct Case {
    int64_t head, num_heads, num_kv_heads;
  };
  for (const Case c : {Case{64, 32, 8}, Case{128, 8, 8}, Case{256, 16, 1}}) {
    for (const DType dt : {DType::bf16, DType::f16}) {
      check_decode(decode_spec({.num_heads = c.num_heads,
                                .num_kv_heads = c.num_kv_heads,
                                .head_size = c.head,
                                .block_size = 16,
                                .dtype = dt,
                                .cache_dtype = DType::fp8e4m3,
                                .seq_lens = {4500},
                                .seed = uint64_t(200 + c.head),
                                .kv_scales = {1.25f, 0.75f}}));
    }
  }
}

TEST(FlashAttnDecodeGpu, Fp8PagesBatch64MixedLengthsOneSplit) {
  KBN_SKIP_WITHOUT_GPU();
  // 64 sequences x 4 kv heads: 256 blocks, one split on a 132-SM H100 / H200 (choose_splits), so the split kernel
  // writes the output itself. Groups 8 (head 64), 4 (head 128 and 256) and 12 (head 256: Q in shared memory, 4
  // padding rows); pages of 32 and 16 keys; f16 and bf16 q.
  struct Case {
    int64_t head, group, block;
    DType dt;
  };
  for (const Case c : {Case{64, 8, 32, DType::f16}, Case{128, 4, 16, DType::bf16}, Case{256, 12, 32, DType::bf16},
                       Case{256, 4, 16, DType::f16}}) {
    const uint64_t seed = uint64_t(210 + c.head + c.group);
    check_decode(decode_spec({.num_heads = 4 * c.group,
                              .num_kv_heads = 4,
                              .head_size = c.head,
                              .block_size = c.block,
                              .dtype = c.dt,
                              .cache_dtype = DType::fp8e4m3,
                              .seq_lens = random_lengths(62, 800, {1500, 1501}, seed),
                              .seed = seed,
                              .kv_scales = {0.5f, 3.0f}}));
  }
}

TEST(FlashAttnDecodeGpu, Fp8PagesFirstAndLastKeysAreSeen) {
  KBN_SKIP_WITHOUT_GPU();
  // Even heads copy their sequence's newest key, odd heads its first: a key lost or misplaced at a tile, page or
  // split edge (or a chunk widened into the wrong place) changes those rows completely.
  for (const int64_t head : {64, 128, 256}) {
    for (const int64_t group : {2, 16}) {
      const BatchSpec s = decode_spec({.num_heads = 2 * group,
                                       .num_kv_heads = 2,
                                       .head_size = head,
                                       .block_size = 16,
                                       .dtype = DType::bf16,
                                       .cache_dtype = DType::fp8e4m3,
                                       .seq_lens = {1, 64, 65, 1000, 4097},
                                       .seed = uint64_t(220 + head + group)});
      PagedBatch b = make_batch(s);
      align_queries_with_keys(
          b, s, [&](int seq, int pos, int h) { return h % 2 == 0 ? pos : 0; }, 2.f);
      check_decode(s, b);
    }
  }
}

// Prefill over fp8 e4m3 pages: the mma.sync kernel widens each landed tile to f16 in shared memory (f16 mmas, a bf16
// Q tile rounded to f16 in place), at every tensor-core head size; f32 q takes the generic kernel. Tolerance as for
// 16-bit pages (the widening is exact, bf16 q of these magnitudes is exact in f16, P keeps 11 bits); the oracle reads
// the same fp8 pages. Varlen with a chunk after cached context, more query tiles than one, GQA 4 and none (windows and
// sinks: FlashAttnFeaturesGpu.Fp8PrefillWindowAndSinks).
TEST(FlashAttnPrefillGpu, Fp8PagesOnTensorCores) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t head_size : {64, 128, 192, 256}) {
    for (const DType dt : {DType::bf16, DType::f16}) {
      check_prefill({.num_heads = 8,
                     .num_kv_heads = head_size == 192 ? 8 : 2,
                     .head_size = head_size,
                     .block_size = 16,
                     .dtype = dt,
                     .cache_dtype = DType::fp8e4m3,
                     .q_lens = {37, 1, 130, 300},
                     .seq_lens = {37, 90, 200, 333},
                     .seed = uint64_t(60 + head_size),
                     .kv_scales = {1.25f, 0.75f}});
    }
  }
  check_prefill({.num_heads = 8,
                 .num_kv_heads = 2,
                 .head_size = 64,
                 .block_size = 16,
                 .dtype = DType::f32,
                 .cache_dtype = DType::fp8e4m3,
                 .q_lens = {37, 1, 130},
                 .seq_lens = {37, 90, 200},
                 .kv_scales = {1.25f, 0.75f}});
}

TEST(FlashAttnPrefillGpu, Fp8PagesHopperRingAcrossItemsAndPageSizes) {
  KBN_SKIP_WITHOUT_GPU();
  // On Hopper, fp8 pages at heads 64 and 128 take the TMA kernel: the copies land in an fp8 ring and the producer
  // warpgroup's converter warps widen them into the 16-bit ring. Every page size its tensor maps take (8..128), a
  // batch with more work items than blocks (both rings wrap across items), chunks after cached context.
  for (const int64_t head_size : {64, 128}) {
    for (const int64_t block_size : {8, 32, 128}) {
      BatchSpec s{.num_heads = 32,
                  .num_kv_heads = 4,
                  .head_size = head_size,
                  .block_size = block_size,
                  .dtype = block_size == 32 ? DType::f16 : DType::bf16,
                  .cache_dtype = DType::fp8e4m3,
                  .seed = uint64_t(70 + block_size),
                  .kv_scales = {block_size == 32 ? 0.25f : 1.f, block_size == 8 ? 1.5f : 1.f}};
      for (int i = 0; i < 24; ++i) {
        const int q = 1 + (i * 173) % 400;
        s.q_lens.push_back(q);
        s.seq_lens.push_back(q + (i % 3 == 0 ? (i * 53) % 500 : 0));
      }
      check_prefill(s);
    }
  }
}

TEST(FlashAttnDecodeGpu, GenericKernelCoversOtherHeadSizesAndF32) {
  KBN_SKIP_WITHOUT_GPU();
  check_decode(decode_spec({.num_heads = 4,
                            .num_kv_heads = 2,
                            .head_size = 96,
                            .block_size = 16,
                            .dtype = DType::bf16,
                            .seq_lens = {1, 70, 300},
                            .seed = 21}));
  check_decode(decode_spec({.num_heads = 4,
                            .num_kv_heads = 1,
                            .head_size = 16,
                            .block_size = 16,
                            .dtype = DType::f32,
                            .seq_lens = {3, 129},
                            .seed = 22}));
  // fp8 pages with per-tensor scales on the generic kernel: a head size the tensor-core kernel lacks, and f32 q.
  check_decode(decode_spec({.num_heads = 4,
                            .num_kv_heads = 2,
                            .head_size = 96,
                            .block_size = 16,
                            .dtype = DType::bf16,
                            .cache_dtype = DType::fp8e4m3,
                            .seq_lens = {1, 70, 300},
                            .seed = 23,
                            .kv_scales = {1.25f, 0.75f}}));
  check_decode(decode_spec({.num_heads = 8,
                            .num_kv_heads = 2,
                            .head_size = 64,
                            .block_size = 16,
                            .dtype = DType::f32,
                            .cache_dtype = DType::fp8e4m3,
                            .seq_lens = {5, 900},
                            .seed = 24,
                            .kv_scales = {0.5f, 2.0f}}));
}

TEST(FlashAttnDecodeGpu, Batch1LongContextSplitsKeys) {
  KBN_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16}) {
    check_decode(decode_spec({.num_heads = 32,
                              .num_kv_heads = 8,
                              .head_size = 128,
                              .block_size = 16,
                              .dtype = dt,
                              .seq_lens = {4500},
                              .seed = 11}));
  }
}

TEST(FlashAttnDecodeGpu, Batch64MixedLengthsGqa8x2) {
  KBN_SKIP_WITHOUT_GPU();
  check_decode(decode_spec({.num_heads = 8,
                            .num_kv_heads = 2,
                            .head_size = 128,
                            .block_size = 16,
                            .dtype = DType::bf16,
                            .seq_lens = random_lengths(60, 1500, {4096, 4097, 4200, 4500}, 12),
                            .seed = 12}));
}

TEST(FlashAttnDecodeGpu, Batch64Gqa4x1Head64Block32F16) {
  KBN_SKIP_WITHOUT_GPU();
  check_decode(decode_spec({.num_heads = 4,
                            .num_kv_heads = 1,
                            .head_size = 64,
                            .block_size = 32,
                            .dtype = DType::f16,
                            .seq_lens = random_lengths(62, 2000, {4100, 4133}, 13),
                            .seed = 13}));
}

TEST(FlashAttnDecodeGpu, ShortSequencesNoGqa) {
  KBN_SKIP_WITHOUT_GPU();
  // Few keys: one split, the output is written by the split kernel itself (no reduce).
  check_decode(decode_spec({.num_heads = 8,
                            .num_kv_heads = 8,
                            .head_size = 64,
                            .block_size = 16,
                            .dtype = DType::bf16,
                            .seq_lens = {1, 2, 63},
                            .seed = 14}));
}

TEST(FlashAttnDecodeGpu, GroupLargerThanOneMmaOfRows) {
  KBN_SKIP_WITHOUT_GPU();
  // 20 query heads per kv head: two 16-row head chunks per kv head, the second one partly padding.
  check_decode(decode_spec({.num_heads = 40,
                            .num_kv_heads = 2,
                            .head_size = 128,
                            .block_size = 32,
                            .dtype = DType::bf16,
                            .seq_lens = {5, 300, 1000},
                            .seed = 15}));
}

TEST(FlashAttnDecodeGpu, FirstAndLastKeysAreSeen) {
  KBN_SKIP_WITHOUT_GPU();
  const BatchSpec s = decode_spec({.num_heads = 8,
                                   .num_kv_heads = 2,
                                   .head_size = 128,
                                   .block_size = 16,
                                   .dtype = DType::bf16,
                                   .seq_lens = {1, 64, 65, 1000, 4097},
                                   .seed = 16});
  PagedBatch b = make_batch(s);
  align_queries_with_keys(
      b, s, [&](int seq, int pos, int h) { return h % 2 == 0 ? pos : 0; }, 2.f);
  check_decode(s, b);
}

// ---- decode at head 256 (Gemma-3: 16 query heads per 8 kv heads): the Hopper tensor-core kernel (512-byte bulk
// copies, a three-stage ring per warp, one block per SM); other GPUs run the generic kernel, which these check too ----

TEST(FlashAttnDecodeGpu, Head256Batch1LongContextSplitsKeys) {
  KBN_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16}) {
    check_decode(decode_spec({.num_heads = 16,
                              .num_kv_heads = 8,
                              .head_size = 256,
                              .block_size = 16,
                              .dtype = dt,
                              .seq_lens = {4500},
                              .seed = 101}));
  }
}

TEST(FlashAttnDecodeGpu, Head256Batch64MixedLengthsGqa8x1) {
  KBN_SKIP_WITHOUT_GPU();
  // Group 8: every row of the block's single n-tile of query heads is real.
  for (DType dt : {DType::bf16, DType::f16}) {
    check_decode(decode_spec({.num_heads = 8,
                              .num_kv_heads = 1,
                              .head_size = 256,
                              .block_size = 16,
                              .dtype = dt,
                              .seq_lens = random_lengths(60, 1500, {4096, 4097, 4200, 4500}, 102),
                              .seed = 102}));
  }
}

TEST(FlashAttnDecodeGpu, Head256ShortSequencesGqa16x8) {
  KBN_SKIP_WITHOUT_GPU();
  // Few keys: one split, the output written by the split kernel itself; a page size that is not a power of two.
  for (const int64_t block_size : {16, 24}) {
    check_decode(decode_spec({.num_heads = 16,
                              .num_kv_heads = 8,
                              .head_size = 256,
                              .block_size = block_size,
                              .dtype = DType::bf16,
                              .seq_lens = {1, 2, 17, 63, 64, 65, 200},
                              .seed = uint64_t(103 + block_size)}));
  }
}

TEST(FlashAttnDecodeGpu, Head256GroupsOf12To20ReadQFromSharedMemory) {
  KBN_SKIP_WITHOUT_GPU();
  // More than 8 query heads per kv head: two n-tiles (16 rows) per block, Q read from shared memory (its registers
  // would spill beside the 128 O^T accumulators). Groups 16 (full), 12 (padding rows) and 20 (a second 16-row head
  // chunk holding 4 heads); f16 too.
  for (const int64_t group : {16, 12, 20}) {
    check_decode(decode_spec({.num_heads = 2 * group,
                              .num_kv_heads = 2,
                              .head_size = 256,
                              .block_size = 32,
                              .dtype = DType::bf16,
                              .seq_lens = {5, 300, 1000, 4500},
                              .seed = uint64_t(110 + group)}));
  }
  check_decode(decode_spec({.num_heads = 16,
                            .num_kv_heads = 1,
                            .head_size = 256,
                            .block_size = 16,
                            .dtype = DType::f16,
                            .seq_lens = random_lengths(14, 1500, {4100, 4133}, 131),
                            .seed = 131}));
}

TEST(FlashAttnDecodeGpu, Head256FirstAndLastKeysAreSeen) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t group : {2, 16}) {  // Q in registers, Q in shared memory
    const BatchSpec s = decode_spec({.num_heads = 2 * group,
                                     .num_kv_heads = 2,
                                     .head_size = 256,
                                     .block_size = 16,
                                     .dtype = DType::bf16,
                                     .seq_lens = {1, 64, 65, 1000, 4097},
                                     .seed = uint64_t(140 + group)});
    PagedBatch b = make_batch(s);
    align_queries_with_keys(
        b, s, [&](int seq, int pos, int h) { return h % 2 == 0 ? pos : 0; }, 2.f);
    check_decode(s, b);
  }
}

// ---- per-layer features: sliding window, logit soft-cap, sinks (the tensor-core kernels for bf16 / f16 at head
// sizes 64 and 128, prefill's at 192 and 256 too, decode's at 256 on Hopper; the generic kernel otherwise) ----

struct Features {
  int64_t window = 0;
  double soft_cap = 0;
  bool sinks = false;
  DType sinks_dtype = DType::f32;
  // Even heads' queries copy the oldest key inside their window, odd heads' the newest key just outside it (key 0
  // when the window reaches it), with a gain that makes the copied key dominate: a window edge off by one key changes
  // those rows completely.
  bool align_edges = false;
};

// Fills with NaN every page that lies wholly before the window of all of a sequence's queries: a kernel that reads
// one (the issue: "their pages never read") mixes NaN into the output. Pages straddling a window's start stay.
void poison_pages_outside_windows(PagedBatch& b, const BatchSpec& s, int64_t window) {
  if (window <= 0) return;
  std::vector<float> keys = b.key_cache.to_floats(), values = b.value_cache.to_floats();
  const int64_t row = s.num_kv_heads * s.head_size;
  for (size_t i = 0; i < s.seq_lens.size(); ++i) {
    const int64_t first_query = s.seq_lens[i] - s.q_lens[i];
    const int64_t first_key = std::max<int64_t>(first_query - window + 1, 0);
    for (int64_t j = 0; (j + 1) * s.block_size <= first_key; ++j) {
      const int64_t block = b.table[i * size_t(b.max_blocks_per_seq) + size_t(j)];
      std::fill_n(keys.begin() + block * s.block_size * row, s.block_size * row, kNaN);
      std::fill_n(values.begin() + block * s.block_size * row, s.block_size * row, kNaN);
    }
  }
  b.key_cache = Tensor::from_floats(keys, b.key_cache.shape(), b.key_cache.dtype());  // q's dtype or fp8 e4m3
  b.value_cache = Tensor::from_floats(values, b.value_cache.shape(), b.value_cache.dtype());
}

// The host batch of a features case: aligned edges first (they read keys the poison would overwrite), then poison.
PagedBatch make_feature_batch(const BatchSpec& s, const Features& f) {
  PagedBatch b = make_batch(s);
  if (f.align_edges && f.window > 0) {
    const int w = int(f.window);
    align_queries_with_keys(
        b, s, [&](int, int pos, int h) { return h % 2 == 0 ? std::max(pos - w + 1, 0) : std::max(pos - w, 0); },
        2.f);
  }
  poison_pages_outside_windows(b, s, f.window);
  return b;
}

std::string describe(const Features& f) {
  std::ostringstream os;
  os << " window " << f.window << " soft_cap " << f.soft_cap << (f.sinks ? " sinks " : "")
     << (f.sinks ? kbn::dtype_name(f.sinks_dtype) : "");
  return os.str();
}

// Sinks around the logits' own scale (N(0, 2^2)), so some heads' sinks take much of the weight and some little.
Tensor make_sinks(int64_t heads, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> v(static_cast<size_t>(heads));
  for (float& x : v) x = normal(rng);
  return Tensor::from_floats(v, {heads}, dt);
}

void check_prefill_features(const BatchSpec& s, const Features& f) {
  const std::string what = describe(s, "flash_attn_prefill") + describe(f);
  FlashAttnPrefill op(s.num_heads, s.head_size, 1.0 / std::sqrt(double(s.head_size)), s.num_kv_heads, f.window,
                      f.soft_cap);
  const PagedBatch b = make_feature_batch(s, f);
  const DeviceBatch d = to_device(b);
  const Tensor sinks = make_sinks(s.num_heads, f.sinks_dtype, s.seed + 7);
  const Tensor sinks_gpu = sinks.to(Device::cuda());
  void* poisoned = poison_next_output(d.q);
  auto run = [&](const DeviceBatch& x, const Tensor& sk) {
    return f.sinks ? op.forward(x.q, x.key_cache, x.value_cache, x.query_start_loc, x.seq_lens, x.block_tables,
                                b.max_query_len, b.max_seq_len, sk, s.kv_scales)
                   : op.forward(x.q, x.key_cache, x.value_cache, x.query_start_loc, x.seq_lens, x.block_tables,
                                b.max_query_len, b.max_seq_len, s.kv_scales);
  };
  const Tensor gpu = run(d, sinks_gpu);
  EXPECT_EQ(gpu.data_ptr(), poisoned) << what << ": the output did not land on the NaN-poisoned block";
  const Tensor again = run(d, sinks_gpu);
  const DeviceBatch host{b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables};
  const Tensor oracle = run(host, sinks);
  expect_matches_oracle(gpu, oracle, s.dtype, what);
  expect_bitwise_equal(gpu, again, what);
}

void check_decode_features(const BatchSpec& s, const Features& f) {
  const std::string what = describe(s, "flash_attn_decode") + describe(f);
  FlashAttnDecode op(s.num_heads, s.head_size, 1.0 / std::sqrt(double(s.head_size)), s.num_kv_heads, f.window,
                     f.soft_cap);
  const PagedBatch b = make_feature_batch(s, f);
  const DeviceBatch d = to_device(b);
  const Tensor sinks = make_sinks(s.num_heads, f.sinks_dtype, s.seed + 7);
  const Tensor sinks_gpu = sinks.to(Device::cuda());
  void* poisoned = poison_next_output(d.q);
  auto run = [&](const DeviceBatch& x, const Tensor& sk) {
    return f.sinks ? op.forward(x.q, x.key_cache, x.value_cache, x.seq_lens, x.block_tables, b.max_seq_len, sk,
                                s.kv_scales)
                   : op.forward(x.q, x.key_cache, x.value_cache, x.seq_lens, x.block_tables, b.max_seq_len, s.kv_scales);
  };
  const Tensor gpu = run(d, sinks_gpu);
  EXPECT_EQ(gpu.data_ptr(), poisoned) << what << ": the output did not land on the NaN-poisoned block";
  const Tensor again = run(d, sinks_gpu);
  const DeviceBatch host{b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables};
  const Tensor oracle = run(host, sinks);
  expect_matches_oracle(gpu, oracle, s.dtype, what);
  expect_bitwise_equal(gpu, again, what);
}

TEST(FlashAttnFeaturesGpu, Fp8PrefillWindowAndSinks) {
  KBN_SKIP_WITHOUT_GPU();
  const BatchSpec w{.num_heads = 16, .num_kv_heads = 2, .head_size = 64, .block_size = 16, .dtype = DType::bf16,
                    .cache_dtype = DType::fp8e4m3, .q_lens = {200, 7}, .seq_lens = {200, 250}, .seed = 61,
                    .kv_scales = {0.8f, 1.5f}};
  check_prefill_features(w, {.window = 24, .sinks = true, .align_edges = true});
  check_prefill_features(w, {.soft_cap = 2.0});
}

TEST(FlashAttnFeaturesGpu, GptOssLikeWindowAndSinks) {
  KBN_SKIP_WITHOUT_GPU();
  // gpt-oss: head_dim 64, 8 query heads per kv head, 128-token windows (here 24, shorter than the sequences), sinks.
  const BatchSpec s{.num_heads = 16, .num_kv_heads = 2, .head_size = 64, .block_size = 16, .dtype = DType::bf16,
                    .q_lens = {40, 7, 1}, .seq_lens = {40, 90, 33}, .seed = 31};
  check_prefill_features(s, {.window = 24, .sinks = true, .sinks_dtype = DType::bf16});
  check_prefill_features(s, {.sinks = true});
  check_prefill_features(s, {.window = 24});
  check_decode_features(decode_spec({.num_heads = 16, .num_kv_heads = 2, .head_size = 64, .block_size = 16,
                                     .dtype = DType::bf16, .seq_lens = {1, 20, 300}, .seed = 32}),
                        {.window = 24, .sinks = true});
}

TEST(FlashAttnFeaturesGpu, GemmaLikeHead256WindowAndSoftCap) {
  KBN_SKIP_WITHOUT_GPU();
  // Gemma-3: head_dim 256, 2 query heads per kv head, 1024-token local windows (here 32); Gemma-2's soft cap 50 (and a
  // low one that bites).
  const BatchSpec s{.num_heads = 4, .num_kv_heads = 2, .head_size = 256, .block_size = 16, .dtype = DType::bf16,
                    .q_lens = {70, 5}, .seq_lens = {70, 100}, .seed = 33};
  check_prefill_features(s, {.window = 32});
  check_prefill_features(s, {.window = 32, .soft_cap = 50.0});
  check_prefill_features(s, {.soft_cap = 1.0});
  // Several query tiles and two-stage K/V rings (Hopper's wgmma kernel: 64-key tiles; other GPUs: mma.sync), a chunk
  // after cached context, f16 too.
  for (const DType dt : {DType::bf16, DType::f16}) {
    const BatchSpec big{.num_heads = 8, .num_kv_heads = 4, .head_size = 256, .block_size = 16, .dtype = dt,
                        .q_lens = {300, 37}, .seq_lens = {300, 500}, .seed = 37};
    check_prefill_features(big, {});
    check_prefill_features(big, {.window = 100});
  }
  check_decode_features(decode_spec({.num_heads = 4, .num_kv_heads = 2, .head_size = 256, .block_size = 16,
                                     .dtype = DType::bf16, .seq_lens = {2, 64, 200}, .seed = 34}),
                        {.window = 32, .soft_cap = 1.0});
}

TEST(FlashAttnFeaturesGpu, F32EveryFeatureAndAWindowOfOne) {
  KBN_SKIP_WITHOUT_GPU();
  const BatchSpec s{.num_heads = 4, .num_kv_heads = 1, .head_size = 128, .block_size = 16, .dtype = DType::f32,
                    .q_lens = {17, 3}, .seq_lens = {17, 40}, .seed = 35};
  check_prefill_features(s, {.window = 5, .soft_cap = 2.0, .sinks = true});
  check_prefill_features(s, {.window = 1});
  check_decode_features(decode_spec({.num_heads = 4, .num_kv_heads = 1, .head_size = 128, .block_size = 16,
                                     .dtype = DType::f32, .seq_lens = {1, 5, 80}, .seed = 36}),
                        {.window = 1, .sinks = true});
}

// The tensor-core prefill kernels with windows: the Hopper (TMA) kernel for pages of 16 and 64 keys, many 128-key
// tiles skipped, chunked prefill (queries after cached keys), windows not a multiple of a page or a tile; pages of
// 24 keys (no tensor map: the mma.sync kernel).
TEST(FlashAttnFeaturesGpu, TensorCorePrefillWindowsSkipTilesAndNeverReadTheirPages) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t block : {16, 64, 24}) {
    for (const int64_t head : {64, 128}) {
      const BatchSpec s{.num_heads = 16, .num_kv_heads = 2, .head_size = head, .block_size = block,
                        .dtype = DType::bf16, .q_lens = {700, 130, 1, 257}, .seq_lens = {700, 1000, 517, 300},
                        .seed = uint64_t(40 + block + head)};
      check_prefill_features(s, {.window = 128, .align_edges = true});
      check_prefill_features(s, {.window = 200, .sinks = true, .align_edges = true});
      if (block == 16) {
        check_prefill_features(s, {.window = 1});
        check_prefill_features(s, {.window = 100, .soft_cap = 3.0, .sinks = true});
        check_prefill_features(s, {.window = 5000});  // wider than every sequence: the plain causal result
      }
    }
  }
  const BatchSpec f16{.num_heads = 8, .num_kv_heads = 8, .head_size = 128, .block_size = 32, .dtype = DType::f16,
                      .q_lens = {300, 64}, .seq_lens = {300, 520}, .seed = 47};
  check_prefill_features(f16, {.window = 77, .soft_cap = 30.0, .sinks = true, .align_edges = true});
  check_prefill_features(f16, {.soft_cap = 0.5});
}

// Decode with windows on the tensor-core kernels: the split partitions cover only the window (long sequences split
// into several), soft cap and sinks through both the one-partition merge and the reduce.
TEST(FlashAttnFeaturesGpu, TensorCoreDecodeWindowsSoftCapAndSinks) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t head : {64, 128}) {
    const BatchSpec one = decode_spec({.num_heads = 64, .num_kv_heads = 8, .head_size = head, .block_size = 16,
                                       .dtype = DType::bf16, .seq_lens = {5000}, .seed = uint64_t(50 + head)});
    check_decode_features(one, {.window = 1024, .sinks = true, .align_edges = true});
    check_decode_features(one, {.window = 128, .soft_cap = 2.0, .align_edges = true});
    const BatchSpec many = decode_spec({.num_heads = 16, .num_kv_heads = 2, .head_size = head, .block_size = 16,
                                        .dtype = DType::bf16, .seq_lens = {1, 127, 128, 129, 700, 3000, 64, 2},
                                        .seed = uint64_t(60 + head)});
    check_decode_features(many, {.window = 128, .sinks = true, .align_edges = true});
    check_decode_features(many, {.sinks = true});
    check_decode_features(many, {.soft_cap = 1.0});
  }
  const BatchSpec f16 = decode_spec({.num_heads = 8, .num_kv_heads = 1, .head_size = 128, .block_size = 64,
                                     .dtype = DType::f16, .seq_lens = {900, 33}, .seed = 70});
  check_decode_features(f16, {.window = 65, .soft_cap = 20.0, .sinks = true, .sinks_dtype = DType::bf16,
                              .align_edges = true});
}

// The same at head 256 (Gemma-3: 16 query heads per 8 kv heads, 1024-key local windows on five layers of six; the
// Hopper tensor-core kernel, the generic kernel elsewhere): a long sequence whose window is split into partitions,
// soft cap and sinks through the one-partition merge and the reduce, groups 2, 8 and 16 (Q in shared memory).
TEST(FlashAttnFeaturesGpu, TensorCoreDecodeHead256WindowsSoftCapAndSinks) {
  KBN_SKIP_WITHOUT_GPU();
  const BatchSpec one = decode_spec({.num_heads = 16, .num_kv_heads = 8, .head_size = 256, .block_size = 16,
                                     .dtype = DType::bf16, .seq_lens = {5000}, .seed = 150});
  check_decode_features(one, {.window = 1024, .align_edges = true});
  check_decode_features(one, {.window = 1024, .sinks = true, .align_edges = true});
  check_decode_features(one, {.window = 128, .soft_cap = 2.0, .align_edges = true});
  for (const int64_t heads : {16, 32}) {  // groups 8 and 16 over 2 kv heads
    const BatchSpec many = decode_spec({.num_heads = heads, .num_kv_heads = 2, .head_size = 256, .block_size = 16,
                                        .dtype = DType::bf16, .seq_lens = {1, 127, 128, 129, 700, 3000, 64, 2},
                                        .seed = uint64_t(150 + heads)});
    check_decode_features(many, {.window = 128, .sinks = true, .align_edges = true});
    check_decode_features(many, {.sinks = true});
    check_decode_features(many, {.window = 1024, .soft_cap = 1.0});
  }
  const BatchSpec f16 = decode_spec({.num_heads = 16, .num_kv_heads = 8, .head_size = 256, .block_size = 64,
                                     .dtype = DType::f16, .seq_lens = {900, 33, 2100}, .seed = 190});
  check_decode_features(f16, {.window = 1024, .soft_cap = 20.0, .sinks = true, .sinks_dtype = DType::bf16,
                              .align_edges = true});
}

// The same over fp8 e4m3 pages (Hopper: the tensor-core kernel's widened tiles; the generic kernel elsewhere), heads
// 64, 128 and 256: a long sequence whose 4096-key window is split into partitions (sinks through the reduce; a
// 128-key window and a soft cap in one partition), eight sequences of mixed lengths with group 16 (Q in shared memory
// at head 256) and f16 q, and 64 sequences x 4 kv heads whose 128-key windows make one split (the split kernel's own
// output, with its sinks and soft cap). Tolerance: see the fp8 decode tests above.
TEST(FlashAttnFeaturesGpu, TensorCoreDecodeFp8PagesWindowsSoftCapAndSinks) {
  KBN_SKIP_WITHOUT_GPU();
  for (const int64_t head : {64, 128, 256}) {
    const BatchSpec one = decode_spec({.num_heads = 16, .num_kv_heads = 2, .head_size = head, .block_size = 16,
                                       .dtype = DType::bf16, .cache_dtype = DType::fp8e4m3, .seq_lens = {5000},
                                       .seed = uint64_t(230 + head), .kv_scales = {1.25f, 0.75f}});
    check_decode_features(one, {.window = 4096, .sinks = true, .align_edges = true});
    check_decode_features(one, {.window = 128, .soft_cap = 2.0, .sinks = true});
    const BatchSpec many = decode_spec({.num_heads = 32, .num_kv_heads = 2, .head_size = head, .block_size = 32,
                                        .dtype = DType::f16, .cache_dtype = DType::fp8e4m3,
                                        .seq_lens = {1, 127, 128, 129, 700, 3000, 64, 2},
                                        .seed = uint64_t(240 + head)});
    check_decode_features(many, {.window = 128, .soft_cap = 20.0, .sinks = true, .sinks_dtype = DType::bf16,
                                 .align_edges = true});
    const BatchSpec batch = decode_spec({.num_heads = 16, .num_kv_heads = 4, .head_size = head, .block_size = 16,
                                         .dtype = DType::bf16, .cache_dtype = DType::fp8e4m3,
                                         .seq_lens = random_lengths(64, 700, {}, uint64_t(250 + head)),
                                         .seed = uint64_t(250 + head), .kv_scales = {0.5f, 2.0f}});
    check_decode_features(batch, {.window = 128, .soft_cap = 2.0, .sinks = true});
  }
}

TEST(FlashAttnFeaturesGpu, BadFeaturesNameTheArgument) {
  KBN_SKIP_WITHOUT_GPU();
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const kbn::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { FlashAttnPrefill(4, 64, 0.125, 2, -1); }).find("'sliding_window'"), std::string::npos);
  EXPECT_NE(message([] { FlashAttnDecode(4, 64, 0.125, 2, 0, -1.0); }).find("'logits_soft_cap'"), std::string::npos);
  const BatchSpec s = decode_spec({.num_heads = 4, .num_kv_heads = 2, .head_size = 64, .seq_lens = {3}, .seed = 37});
  const PagedBatch b = make_batch(s);
  const DeviceBatch d = to_device(b);
  FlashAttnDecode op(4, 64, 0.125, 2);
  const Tensor three = make_sinks(3, DType::f32, 1).to(Device::cuda());
  const std::string m = message([&] { op.forward(d.q, d.key_cache, d.value_cache, d.seq_lens, d.block_tables, 3, three); });
  EXPECT_NE(m.find("'sinks'"), std::string::npos) << m;
  const Tensor on_cpu = make_sinks(4, DType::f32, 1);
  const std::string m2 =
      message([&] { op.forward(d.q, d.key_cache, d.value_cache, d.seq_lens, d.block_tables, 3, on_cpu); });
  EXPECT_NE(m2.find("'sinks'"), std::string::npos) << m2;
}

TEST(FlashAttnDecodeGpu, EmptyBatchLaunchesNothing) {
  KBN_SKIP_WITHOUT_GPU();
  const Device dev = Device::cuda();
  FlashAttnDecode op(8, 128, 0.088, 2);
  const Tensor cache = Tensor::zeros({4, 16, 2, 128}, DType::bf16, dev);
  const Tensor out = op.forward(Tensor::empty({0, 8, 128}, DType::bf16, dev), cache, cache,
                                Tensor::empty({0}, DType::i32, dev), Tensor::empty({0, 1}, DType::i32, dev), 0);
  EXPECT_EQ(out.shape(), (kbn::Shape{0, 8, 128}));
}

// ---- argument checks (CPU tensors: these run without a GPU too) ----

template <class F>
void expect_refusal(F&& call, const std::string& mentions) {
  try {
    call();
    ADD_FAILURE() << "expected an error mentioning '" << mentions << "'";
  } catch (const kbn::Error& e) {
    EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
  }
}

TEST(FlashAttnArguments, PrefillRefusesInconsistentInputs) {
  const BatchSpec s{
      .num_heads = 4, .num_kv_heads = 2, .head_size = 64, .block_size = 16, .q_lens = {3, 5}, .seq_lens = {3, 9}};
  const PagedBatch b = make_batch(s);
  FlashAttnPrefill op(4, 64, 0.125, 2);
  auto call = [&](const Tensor& q, const Tensor& kc, const Tensor& qsl, const Tensor& sl, const Tensor& bt,
                  int64_t max_q) { return op.forward(q, kc, b.value_cache, qsl, sl, bt, max_q, b.max_seq_len); };
  expect_refusal(
      [&] {
        call(b.q.view({8, 256}), b.key_cache, b.query_start_loc, b.seq_lens, b.block_tables, 5);
      },
      "'q' must be 3-D");
  expect_refusal(
      [&] {
        FlashAttnPrefill(8, 32, 0.1, 2)
            .forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables, 5, 9);
      },
      "num_heads");
  expect_refusal([&] { call(b.q, b.key_cache.to(DType::f16), b.query_start_loc, b.seq_lens, b.block_tables, 5); },
                 "same dtype");
  expect_refusal([&] { call(b.q, b.key_cache, b.query_start_loc.slice(0, 0, 2), b.seq_lens, b.block_tables, 5); },
                 "query_start_loc");
  expect_refusal([&] { call(b.q, b.key_cache, b.query_start_loc, b.seq_lens.to(DType::f32), b.block_tables, 5); },
                 "seq_lens");
  expect_refusal([&] { call(b.q, b.key_cache, b.query_start_loc, b.seq_lens, b.block_tables.slice(0, 0, 1), 5); },
                 "block_tables");
  expect_refusal([&] { call(b.q, b.key_cache, b.query_start_loc, b.seq_lens, b.block_tables, 0); }, "max_query_len");
  expect_refusal([] { FlashAttnPrefill(6, 64, 0.1, 4); }, "num_kv_heads");
  expect_refusal(
      [&] {
        op.forward(b.q, b.key_cache, b.value_cache.slice(1, 0, 8).contiguous(), b.query_start_loc, b.seq_lens,
                   b.block_tables, 5, b.max_seq_len);
      },
      "'value_cache'");
}

TEST(FlashAttnArguments, DecodeRefusesInconsistentInputs) {
  const BatchSpec s =
      decode_spec({.num_heads = 4, .num_kv_heads = 2, .head_size = 64, .block_size = 16, .seq_lens = {3, 9}});
  const PagedBatch b = make_batch(s);
  FlashAttnDecode op(4, 64, 0.125, 2);
  expect_refusal([&] { op.forward(b.q, b.key_cache.slice(2, 0, 1), b.value_cache, b.seq_lens, b.block_tables, 9); },
                 "num_kv_heads");
  expect_refusal([&] { op.forward(b.q, b.key_cache, b.value_cache, b.seq_lens.slice(0, 0, 1), b.block_tables, 9); },
                 "seq_lens");
  expect_refusal([&] { op.forward(b.q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, 0); }, "max_seq_len");
  expect_refusal([&] { op.forward(b.q, b.key_cache, b.value_cache.slice(0, 0, 1), b.seq_lens, b.block_tables, 9); },
                 "value_cache");
}

// ---- throughput smoke (no oracle): prints the rates the issue asks for, checks the output is finite ----

double seconds_per_call(const std::function<Tensor()>& call) {
  for (int i = 0; i < 3; ++i) call();
  kbn::synchronize(Device::cuda());
  constexpr int kIters = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) call();
  kbn::synchronize(Device::cuda());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kIters;
}

void expect_finite(const Tensor& t, const char* what) {
  size_t bad = 0;
  for (float v : t.to_floats()) bad += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " non-finite outputs";
}

TEST(FlashAttnThroughputGpu, Prefill8kCausalGqa32x8) {
  KBN_SKIP_WITHOUT_GPU();
  const Device dev = Device::cuda();
  constexpr int64_t kTokens = 8192, kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;
  Tensor q = Tensor::empty({kTokens, kHeads, kDim}, DType::bf16, dev);
  Tensor kc = Tensor::empty({kTokens / kBlock, kBlock, kKvHeads, kDim}, DType::bf16, dev);
  Tensor vc = Tensor::empty(kc.shape(), DType::bf16, dev);
  kbn::fill_normal_(q, 1, 0, 1);
  kbn::fill_normal_(kc, 2, 0, 1);
  kbn::fill_normal_(vc, 3, 0, 1);
  std::vector<int> table(kTokens / kBlock);
  std::iota(table.begin(), table.end(), 0);
  const Tensor bt = Tensor::from_i32(table, {1, kTokens / kBlock}).to(dev);
  const Tensor qsl = Tensor::from_i32({0, int(kTokens)}, {2}).to(dev);
  const Tensor sl = Tensor::from_i32({int(kTokens)}, {1}).to(dev);
  FlashAttnPrefill op(kHeads, kDim, 1.0 / std::sqrt(double(kDim)), kKvHeads);
  Tensor out;
  const double s = seconds_per_call([&] { return out = op.forward(q, kc, vc, qsl, sl, bt, kTokens, kTokens); });
  // Causal: half of the 2 * 2 * T^2 * H * D multiply-adds of QK^T and PV.
  const double flops = 2.0 * kTokens * kTokens * kHeads * kDim;
  std::printf("flash_attn_prefill bf16 8k causal 32/8 d128: %.3f ms, %.1f TFLOP/s\n", s * 1e3, flops / s * 1e-12);
  expect_finite(out, "prefill 8k");
}

TEST(FlashAttnThroughputGpu, DecodeBatch64Context4k) {
  KBN_SKIP_WITHOUT_GPU();
  const Device dev = Device::cuda();
  constexpr int64_t kSeqs = 64, kContext = 4096, kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;
  constexpr int64_t kBlocksPerSeq = kContext / kBlock;
  Tensor q = Tensor::empty({kSeqs, kHeads, kDim}, DType::bf16, dev);
  Tensor kc = Tensor::empty({kSeqs * kBlocksPerSeq, kBlock, kKvHeads, kDim}, DType::bf16, dev);
  Tensor vc = Tensor::empty(kc.shape(), DType::bf16, dev);
  kbn::fill_normal_(q, 1, 0, 1);
  kbn::fill_normal_(kc, 2, 0, 1);
  kbn::fill_normal_(vc, 3, 0, 1);
  std::vector<int> table(size_t(kSeqs * kBlocksPerSeq));
  std::iota(table.begin(), table.end(), 0);
  const Tensor bt = Tensor::from_i32(table, {kSeqs, kBlocksPerSeq}).to(dev);
  const Tensor sl = Tensor::from_i32(std::vector<int>(kSeqs, int(kContext)), {kSeqs}).to(dev);
  FlashAttnDecode op(kHeads, kDim, 1.0 / std::sqrt(double(kDim)), kKvHeads);
  Tensor out;
  const double s = seconds_per_call([&] { return out = op.forward(q, kc, vc, sl, bt, kContext); });
  const double bytes = double(kc.nbytes() + vc.nbytes());
  std::printf("flash_attn_decode bf16 batch 64 x 4k 32/8 d128: %.3f ms, %.0f GB/s of K/V\n", s * 1e3, bytes / s * 1e-9);
  expect_finite(out, "decode 64x4k");
}

}  // namespace
