#include "L1/fused_experts.h"

#include <cstdint>
#include <limits>

#include "L1/moe_align_block_size.h"
#include "L1/moe_sum.h"
#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "L1/attention_mma.cuh"  // smem_addr, pack2, KernelLaunchFacts, runs_sm90_image
#include "L1/gemv.cuh"
#include "L1/mbarrier.cuh"
#include "L1/tma.cuh"
#include "L1/wgmma.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----
//
// The GPU path, all on the stream with no host sync (so it can be captured in a CUDA graph); up to kGemvMaxTokens
// tokens take the decode path further down instead:
//   1. moe_align_block_size (L1/moe_align_block_size.h) with kBlockM: the pairs grouped by expert, padded to blocks
//      of kBlockM rows, one expert per block.
//   2. moe_permute: x_sorted[r] = hidden_states[sorted[r] / top_k] for the rows of real pairs (padding rows are not
//      written: they reach only discarded outputs), so the GEMMs read their rows as dense tiles; it also zeroes the
//      output rows of pairs whose expert id is out of range (dropped).
//   3. expert GEMM 1 (gate and up): act[r, c] = act(g, u) with [g; u] = w13[expert(r)] x_sorted[r] (+ the expert's
//      w13 bias), per block; act is silu(g) * u or gpt-oss's swigluoai (ExpertAct).
//   4. expert GEMM 2 (down): cache[pair(r)] = topk_weight(pair) * (w2[expert(r)] act[r] (+ the expert's w2 bias)),
//      scattered back to pair order.
//   5. moe_sum (L1/moe_sum.h) over each token's top_k rows.
// The GEMMs read the number of active blocks (num_tokens_post_padded) on the device, so a launch sized for the worst
// case costs nothing for the blocks that stay empty. At decode sizes, where one GEMM's tiles would leave SMs idle, it
// is split along K: the splits write f32 partial sums, and a reduce kernel applies the activation (GEMM 1) or the
// routing weight and the sum over top_k (GEMM 2, replacing steps 4's scatter and 5).
// The intermediates are rounded to the activation dtype where vLLM's caches round them (g and u, act, each y).
//
// Hopper (bf16 / f16, sm_90a image): a block computes a kBlockM x kBlockN accumulator tile (kBlockN 128 at decode
// sizes, 256 at prefill sizes), or its share of K, with wgmma from shared memory, fed by a TMA producer through a
// ring of stages of (A: kBlockM x 64, B: kBlockN x 64) 128-byte-swizzled tiles (A's padding rows are not copied). GEMM
// 1's B tile is kBlockN / 2 gate rows and the matching up rows of one expert (two TMA boxes), so the activation is
// fused in the epilogue and a block writes kBlockN / 2 columns of act; GEMM 2's B tile is kBlockN rows of w2. Every
// other dtype or layout runs a shared-memory-tiled SIMT kernel of the same structure.
constexpr int kBlockM = 128;
constexpr int kBlockK = 64;  // one 128-byte swizzle row of 16-bit values
constexpr int kGroupM = 8;   // m blocks that walk the n tiles together (their B tiles are shared through L2)

struct PermuteParams {
  void* x_sorted;  // [max_padded, hidden]
  void* cache;     // [num_pairs, hidden]: rows of dropped pairs zeroed
  const void* x;   // [num_tokens, hidden]
  const int32_t* sorted;
  const int32_t* post_padded;
  const int32_t* ids;  // [num_pairs]
  int num_pairs, top_k, hidden, num_experts;
};

// Block b takes sorted rows [b kPermuteRows, +kPermuteRows): one coalesced read of their pair ids, then its warps copy
// the rows of real pairs, round robin. Padding rows are left as they are: a GEMM row depends on its own A row alone,
// and padding rows reach only output rows that are discarded (GEMM 2 writes real pairs only), so copying zeros into
// them (at decode most of max_padded: 16k of 18k rows for Qwen3-30B-A3B at 256 tokens, 66 MB of writes) bought
// nothing. The block also zeroes the cache rows of dropped pairs among pairs [b kPermuteRows, +kPermuteRows).
constexpr int kPermuteRows = 32;
static_assert(kBlockM % kPermuteRows == 0, "max_padded is a multiple of kBlockM");

template <class T, bool kVec>
__global__ void __launch_bounds__(128) moe_permute_kernel(PermuteParams p) {
  using V = Vec16<T>;
  constexpr int N = kVec ? V::N : 1, kWarps = 4;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int r0 = int(blockIdx.x) * kPermuteRows;
  const int chunks = p.hidden / N;
  auto copy_row = [&](T* dst, const T* src) {
    for (int c = lane; c < chunks; c += 32) {
      if constexpr (kVec)
        reinterpret_cast<V*>(dst)[c] = src ? reinterpret_cast<const V*>(src)[c] : V{};
      else
        dst[c] = src ? src[c] : from_f32<T>(0.f);
    }
  };
  const int id = r0 + lane < p.num_pairs ? p.ids[r0 + lane] : 0;
  unsigned dropped = __ballot_sync(0xffffffffu, id < 0 || id >= p.num_experts);
  for (int rank = 0; dropped; ++rank, dropped &= dropped - 1)
    if (rank % kWarps == warp)
      copy_row(static_cast<T*>(p.cache) + int64_t(r0 + __ffs(int(dropped)) - 1) * p.hidden, nullptr);
  const int end = min(r0 + kPermuteRows, *p.post_padded);
  const int pair = r0 + lane < end ? p.sorted[r0 + lane] : p.num_pairs;
  unsigned real = __ballot_sync(0xffffffffu, pair < p.num_pairs);
  for (int rank = 0; real; ++rank, real &= real - 1) {
    const int i = __ffs(int(real)) - 1;
    const int src_pair = __shfl_sync(0xffffffffu, pair, i);
    if (rank % kWarps == warp)
      copy_row(static_cast<T*>(p.x_sorted) + int64_t(r0 + i) * p.hidden,
               static_cast<const T*>(p.x) + int64_t(src_pair / p.top_k) * p.hidden);
  }
}

// The expert activation of GEMM 1's epilogue (reference::ExpertFeatures): silu(g) * u, or gpt-oss's swigluoai
// (g' = min(g, limit), u' = clamp(u, -limit, limit), (u' + 1) * g' * sigmoid(alpha * g')). A runtime choice, uniform
// over the launch: one instantiation serves both.
struct ExpertAct {
  int swigluoai;  // 0: silu
  float alpha, limit;
};

__device__ __forceinline__ float silu(float a) { return a / (1.f + __expf(-a)); }

__device__ __forceinline__ float expert_act(const ExpertAct& a, float g, float u) {
  if (!a.swigluoai) return silu(g) * u;
  g = fminf(g, a.limit);
  u = fminf(fmaxf(u, -a.limit), a.limit);
  return (u + 1.f) * g / (1.f + __expf(-a.alpha * g));
}

// What both GEMM kernels need. Mode 1 (gate/up): out = act [max_padded, inter], b_rows = 2 * inter, up_offset =
// inter, n_out = inter, 64 output columns per tile. Mode 2 (down): out = cache [num_pairs, hidden], b_rows = hidden,
// n_out = hidden, 128 output columns per tile.
struct GemmParams {
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* post_padded;
  const float* topk_weights;  // [num_pairs]
  void* out;
  int num_pairs;
  int n_out;      // valid output columns
  int b_rows;     // rows of one expert's weight matrix
  int up_offset;  // mode 1: row of the first up row within an expert
  int k;          // the reduction extent
  int m_blocks, n_tiles;
  // Split K (decode sizes, where the tiles alone would leave SMs idle): work item w is split w % splits of tile
  // w / splits, reducing k blocks [split * kb_per_split, +kb_per_split); its f32 partial sums go to
  // ws [splits, num_pairs, ws_cols] (mode 1: gate sums in columns [0, n_out), up sums in [n_out, 2 n_out); mode 2: the
  // unweighted sums) at the row of the pair, and a reduce kernel finishes the op. splits == 1: no workspace.
  int splits, kb_per_split;
  float* ws;
  // The experts' biases (the weights' dtype; nullptr: none): mode 1 [num_experts, b_rows] (gate, then up), mode 2
  // [num_experts, n_out]. Added to the sums before rounding, as vLLM's kernel adds them to its accumulator.
  const void* bias;
  ExpertAct act;  // mode 1
};

// The bias pair at columns (col, col + 1) of row `row` of a [rows, cols] bias (zeros when there is none).
template <class T>
__device__ __forceinline__ float2 bias2(const void* bias, int64_t row, int cols, int col) {
  if (!bias) return make_float2(0.f, 0.f);
  const T* b = static_cast<const T*>(bias) + row * cols + col;
  return make_float2(to_f32(b[0]), to_f32(b[1]));
}

// Tile (m block, n tile) of linear block index `tile`: groups of kGroupM m blocks walk the n tiles together.
__device__ __forceinline__ void tile_of(int tile, int m_blocks, int n_tiles, int& m, int& n) {
  const int per_group = kGroupM * n_tiles;
  const int group = tile / per_group, first_m = group * kGroupM;
  const int rows = min(kGroupM, m_blocks - first_m);
  const int in_group = tile % per_group;
  m = first_m + in_group % rows;
  n = in_group / rows;
}

template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

namespace hopper_path {

constexpr int kConsumerThreads = 256;  // two warpgroups, 64 rows each
constexpr int kThreads = 128 + kConsumerThreads;
constexpr uint32_t kATileBytes = kBlockM * kBlockK * 2;  // 128 rows x 128 bytes
constexpr int kABoxRows = 16;                            // A's TMA box: 16 rows (two swizzle atoms) x 64 columns

// The two tile shapes: kBlockN = 128 (B tile 128 rows, 7 stages: 112 KB of weights in flight per SM, 229 KB of shared
// memory) for decode-sized launches, where more blocks keep more SMs streaming weights, and kBlockN = 256 (4 stages)
// for prefill, where the wider tile halves the shared-memory operand traffic per FLOP (A is read once per 256 columns
// instead of per 128).
template <int kBlockN>
struct Tile {
  static constexpr int kStages = kBlockN == 256 ? 4 : 7;
  static constexpr uint32_t kBTileBytes = kBlockN * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + 2 * kStages * 8 + 1024;  // + barriers, align
  static constexpr int kAcc = kBlockN / 2;  // accumulator floats per consumer thread (64 rows x kBlockN / 128)
};

template <class T, int kBlockN>
__device__ __forceinline__ void wgmma_tile(float (&d)[kBlockN / 2], uint64_t da, uint64_t db) {
  if constexpr (kBlockN == 256)
    wgmma_ss_n256<T>(d, da, db, 1);
  else
    wgmma_ss_n128<T>(d, da, db, 1);
}

// grid = the most work items the shapes allow (m blocks x n tiles x K splits); block = kThreads (warpgroup 0: the TMA
// producer; 1 and 2: consumers). The active m blocks are read on the device (num_tokens_post_padded): blocks past the
// active items exit at once, so a launch sized for the worst case costs only empty blocks. Block b walks items b,
// b + gridDim.x, ... with the stage ring running on across them, so a smaller (persistent) grid is correct too. The
// launch gives the narrow tiles and any GEMM split along K a persistent grid, one block per SM, and the wide tiles a
// block per item: on the H200 the persistent grid measured faster at one token (same-call A/B: gpt-oss-20b 98.2 -> 91.5
// us, Mixtral 211.0 -> 201.9, Qwen3-30B-A3B 77.3 -> 64.1) and even at 16 and 256 tokens, but 5-9% slower at Mixtral's
// long-K prefill (bench/results/h200/moe/README.md, runs 5 and 8). With the narrow tiles' 7 stages and the metadata
// read one item ahead, Qwen3-30B-A3B's fused_experts went 394 -> 363 us at 16 tokens and 616 -> 564 at 256 on an H100
// (bench/results/h100/session34/, call A). Mode 1's tile is kBlockN / 2 gate rows and the
// matching up rows (kBlockN / 2 act columns); mode 2's, kBlockN rows of w2.
// A consumer warpgroup whose 64 rows are all padding (decode: most blocks hold a few pairs) skips its MMAs.
template <class T, int kMode, int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_expert_gemm_tma_kernel(GemmParams p, const __grid_constant__ CUtensorMap a_map,
                               const __grid_constant__ CUtensorMap b_map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error \
    "fused_experts: wgmma needs Hopper's arch-specific target: KBN_CUDA_GENCODE -gencode=arch=compute_90a,code=sm_90a"
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Tile<kBlockN>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kOutCols = kMode == 1 ? kBlockN / 2 : kBlockN;  // output columns of one tile
  const int m_active = min(p.m_blocks, *p.post_padded / kBlockM);
  const int num_items = m_active * p.n_tiles * p.splits;
  if (int(blockIdx.x) >= num_items) return;  // the whole block leaves: no barrier has been touched

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t full_bar = base + kStages * Cfg::kStageBytes;
  const uint32_t empty_bar = full_bar + kStages * 8;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);                       // the producer's arrive.expect_tx
      mbar_init(empty_bar + 8 * s, kConsumerThreads / 32);  // lane 0 of every consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();
  const int num_kb = (p.k + kBlockK - 1) / kBlockK;
  // Work item -> (m block, n tile, k blocks [kb0, kb1)).
  auto item = [&](int w, int& m, int& n, int& split, int& kb0, int& kb1) {
    split = w % p.splits;
    tile_of(w / p.splits, m_active, p.n_tiles, m, n);
    kb0 = split * p.kb_per_split;
    kb1 = min(num_kb, kb0 + p.kb_per_split);
  };

  if (tid < 128) {
    // ---- producer; `it` counts stage uses over all of this block's items ----
    // A is copied in boxes of kABoxRows rows, and only the boxes that start with a real pair: padding follows an
    // expert's pairs, so they are a prefix. At decode a block holds a few real rows, and its A traffic shrinks with
    // them (rows never copied hold stale values; they only reach output rows that are discarded).
    // issue: item (m block m, B rows from b_row, `live` A boxes), k blocks [kb0, kb1), one stage each.
    auto issue = [&](int& it, int m, int b_row, int live, int kb0, int kb1) {
      const uint32_t bytes = Cfg::kBTileBytes + uint32_t(live) * kABoxRows * 128;
      for (int kb = kb0; kb < kb1; ++kb, ++it) {
        const int s = it % kStages;
        if (it >= kStages) mbar_wait(empty_bar + 8 * s, uint32_t((it / kStages - 1) & 1));
        const uint32_t a_s = base + s * Cfg::kStageBytes, b_s = a_s + kATileBytes, bar = full_bar + 8 * s;
        mbar_arrive_expect_tx(bar, bytes);
        for (int j = 0; j < live; ++j)
          tma_load_2d(a_s + j * kABoxRows * 128, &a_map, bar, kb * kBlockK, m * kBlockM + j * kABoxRows);
        if constexpr (kMode == 1) {
          tma_load_2d(b_s, &b_map, bar, kb * kBlockK, b_row);                                       // gate rows
          tma_load_2d(b_s + Cfg::kBTileBytes / 2, &b_map, bar, kb * kBlockK, b_row + p.up_offset);  // up rows
        } else {
          tma_load_2d(b_s, &b_map, bar, kb * kBlockK, b_row);  // kBlockN rows of w2
        }
      }
    };
    if constexpr (kBlockN == 256) {
      // Wide tiles (prefill, a block per item): one thread issues every copy, and the consumers read the epilogue's
      // metadata after the main loop (kEarly). The narrow tiles' read-ahead warp with the expert id read before the
      // main loop measured 10% slower here (Mixtral-8x7B, 4096 tokens, same-call A/B on an H100: 4662-4682 ->
      // 5147-5161 us, bench/results/h100/session34/; which of the two not isolated), so this path keeps both as
      // they were.
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
      if (tid == 0) {
        int it = 0;
        for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
          int m, n, split, kb0, kb1;
          item(w, m, n, split, kb0, kb1);
          const int b_row = p.expert_ids[m] * p.b_rows + n * kOutCols;
          int live = 0;
          for (int j = 0; j < kBlockM / kABoxRows; ++j)
            if (p.sorted[m * kBlockM + j * kABoxRows] < p.num_pairs) live = j + 1;
          issue(it, m, b_row, live, kb0, kb1);
        }
      }
      return;
    }
    // Narrow tiles (decode sizes, a persistent grid): warp 0, lane 0 issuing every copy.
    if (tid >= 32) return;
    // An item's metadata (its expert and the first pair of each of its A boxes) is read one item ahead, while the
    // previous item's copies are issued, so a new item starts its copies without a wait on global memory (at decode
    // an item streams a few hundred KB: a ~1 us metadata wait per item was a tenth of it). Lane j < kBlockM /
    // kABoxRows holds box j's first pair.
    constexpr int kBoxes = kBlockM / kABoxRows;
    static_assert(kBoxes <= 32, "one lane per A box");
    int m = 0, n = 0, split = 0, kb0 = 0, kb1 = 0, expert = 0, first = 0;
    auto fetch = [&](int w) {
      item(w, m, n, split, kb0, kb1);
      expert = p.expert_ids[m];
      first = tid < kBoxes ? p.sorted[m * kBlockM + tid * kABoxRows] : p.num_pairs;
    };
    int w = blockIdx.x, it = 0;
    fetch(w);
    while (w < num_items) {
      const unsigned live_boxes = __ballot_sync(0xffffffffu, first < p.num_pairs);
      const int live = 32 - __clz(int(live_boxes));
      const int cm = m, ckb0 = kb0, ckb1 = kb1, b_row = expert * p.b_rows + n * kOutCols;
      w += gridDim.x;
      if (w < num_items) fetch(w);  // the next item's loads stay in flight while this item's copies are issued
      if (tid == 0) {
        issue(it, cm, b_row, live, ckb0, ckb1);
      }
      __syncwarp();
    }
    return;
  }

  // ---- consumers: warpgroup wg owns rows 64 wg .. 64 wg + 63 of the tile ----
  if constexpr (kBlockN == 256) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int wg = tid / 128 - 1, lane = tid % 32, warp_in_wg = (tid / 32) % 4;
  const int g = lane / 4, t = lane % 4;
  float d[Cfg::kAcc];
  int it = 0;
  for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
    int m, n, split, kb0, kb1;
    item(w, m, n, split, kb0, kb1);
    const bool live = p.sorted[m * kBlockM + wg * 64] < p.num_pairs;  // uniform over the warpgroup
    if (!live) {  // all 64 rows are padding: hand the stages back as they fill
      for (int kb = kb0; kb < kb1; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(full_bar + 8 * s, uint32_t((it / kStages) & 1));
        if (lane == 0) mbar_arrive(empty_bar + 8 * s);
      }
      continue;
    }
    // The epilogue's metadata (the expert, the pairs of this thread's two rows, and in mode 2 unsplit their routing
    // weights): on the narrow tiles read before the main loop, so the loads overlap the MMAs (the weights, which wait
    // for the pairs, behind the first stage's); on the wide tiles after it, as the producer comment says.
    const int r0 = m * kBlockM + wg * 64 + warp_in_wg * 16 + g;
    constexpr bool kWeighted = kMode == 2;
    constexpr bool kEarly = kBlockN == 128;
    int pair_of[2] = {p.num_pairs, p.num_pairs};
    float wt_of[2] = {0.f, 0.f};
    int64_t expert = 0;
    auto load_pairs = [&] {
      expert = p.expert_ids[m];
      if (kWeighted || p.splits > 1) pair_of[0] = p.sorted[r0], pair_of[1] = p.sorted[r0 + 8];
    };
    auto load_weights = [&] {
      if (kWeighted && p.splits == 1)
        for (int h = 0; h < 2; ++h) wt_of[h] = pair_of[h] < p.num_pairs ? p.topk_weights[pair_of[h]] : 0.f;
    };
    if (kEarly) load_pairs();
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) d[i] = 0.f;
    for (int kb = kb0; kb < kb1; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(full_bar + 8 * s, uint32_t((it / kStages) & 1));
      const uint32_t a_s = base + s * Cfg::kStageBytes + wg * (64 * 128),
                     b_s = base + s * Cfg::kStageBytes + kATileBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk)
        wgmma_tile<T, kBlockN>(d, sw128_desc(a_s + kk * 32, 16, 1024), sw128_desc(b_s + kk * 32, 16, 1024));
      wgmma_commit();
      if (kEarly && kb == kb0) load_weights();
      wgmma_wait<1>();  // the previous stage's group is done: hand its buffers back
      if (kb > kb0 && lane == 0) mbar_arrive(empty_bar + 8 * ((it - 1) % kStages));
    }
    wgmma_wait<0>();
    fence_regs(d);
    if (lane == 0) mbar_arrive(empty_bar + 8 * ((it - 1) % kStages));  // the item's last stage
    if (!kEarly) load_pairs(), load_weights();

    // Accumulator fragment: d[4j + e] is row g (+ 8 for e >= 2), column 8j + 2t + (e & 1).
    constexpr int kHalfTiles = kBlockN / 16;  // mode 1: n-tiles of 8 gate columns; up column c sits at c + kBlockN / 2
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0 + 8 * half;
      if (p.splits > 1) {  // f32 partial sums at the pair's row of this split's workspace
        const int pair = pair_of[half];
        if (pair >= p.num_pairs) continue;
        const int ws_cols = kMode == 1 ? 2 * p.n_out : p.n_out;
        float* ws = p.ws + (int64_t(split) * p.num_pairs + pair) * ws_cols;
        if constexpr (kMode == 1) {
#pragma unroll
          for (int j = 0; j < kHalfTiles; ++j) {
            const int col = n * kOutCols + 8 * j + 2 * t;
            if (col >= p.n_out) continue;
            const int gi = 4 * j + 2 * half, ui = 4 * (j + kHalfTiles) + 2 * half;
            *reinterpret_cast<float2*>(ws + col) = make_float2(d[gi], d[gi + 1]);
            *reinterpret_cast<float2*>(ws + p.n_out + col) = make_float2(d[ui], d[ui + 1]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kBlockN / 8; ++j) {
            const int col = n * kOutCols + 8 * j + 2 * t;
            if (col >= p.n_out) continue;
            *reinterpret_cast<float2*>(ws + col) = make_float2(d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
          }
        }
      } else if constexpr (kMode == 1) {
        T* out = static_cast<T*>(p.out) + int64_t(r) * p.n_out;
#pragma unroll
        for (int j = 0; j < kHalfTiles; ++j) {
          const int col = n * kOutCols + 8 * j + 2 * t;
          if (col >= p.n_out) continue;
          const int gi = 4 * j + 2 * half, ui = 4 * (j + kHalfTiles) + 2 * half;
          const float2 bg = bias2<T>(p.bias, expert, p.b_rows, col),
                       bu = bias2<T>(p.bias, expert, p.b_rows, p.up_offset + col);
          const float a0 = expert_act(p.act, round_to<T>(d[gi] + bg.x), round_to<T>(d[ui] + bu.x));
          const float a1 = expert_act(p.act, round_to<T>(d[gi + 1] + bg.y), round_to<T>(d[ui + 1] + bu.y));
          *reinterpret_cast<uint32_t*>(out + col) = pack2<T>(a0, a1);
        }
      } else {
        const int pair = pair_of[half];
        if (pair >= p.num_pairs) continue;
        const float wt = wt_of[half];
        T* out = static_cast<T*>(p.out) + int64_t(pair) * p.n_out;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
          const int col = n * kOutCols + 8 * j + 2 * t;
          if (col >= p.n_out) continue;
          const float2 b = bias2<T>(p.bias, expert, p.n_out, col);
          *reinterpret_cast<uint32_t*>(out + col) =
              pack2<T>(wt * (d[4 * j + 2 * half] + b.x), wt * (d[4 * j + 2 * half + 1] + b.y));
        }
      }
    }
  }
#else
  __trap();  // not launched: the host picks this kernel only when the binary holds sm_90a code for the device
#endif
}

// A 2-D tensor map over a row-major [rows, cols] matrix of 16-bit values, box [box_rows, 64], 128-byte swizzled;
// false when the layout does not allow one.
bool encode_matrix_map(CUtensorMap& map, const void* base, DType dt, int64_t rows, int64_t cols, int box_rows) {
  const EncodeTiled fn = encode_tiled();
  if (!fn || reinterpret_cast<uintptr_t>(base) % 16 != 0 || cols * 2 % 16 != 0) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols * 2)};
  const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUtensorMapDataType type =
      dt == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace hopper_path

// ---- the split-K reductions (decode sizes; see GemmParams::splits) ----

struct ActSplitsParams {
  void* act;        // [max_padded, inter]
  const float* ws;  // [splits, num_pairs, 2 * inter]
  const int32_t* sorted;
  const int32_t* expert_ids;  // per kBlockM rows
  const int32_t* post_padded;
  const void* bias;  // [num_experts, 2 * inter] or nullptr
  ExpertAct fn;
  int num_pairs, inter, splits;
};

// act[r] = act(gate + bias, up + bias) of each real row r, from GEMM 1's per-split sums (rounded as the unsplit
// epilogue rounds).
// Block (x, y) covers columns [x * 512, +512), four per thread, of rows y, y + gridDim.y, ... below
// num_tokens_post_padded, so the grid need not cover the worst case. inter % 4 == 0 (the Hopper path's rows are
// 16-byte multiples).
template <class T>
__global__ void __launch_bounds__(128) moe_act_mul_splits_kernel(ActSplitsParams p) {
  const int rows = *p.post_padded;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (c >= p.inter) return;
  const int64_t stride = int64_t(p.num_pairs) * 2 * p.inter;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const int pair = p.sorted[r];
    if (pair >= p.num_pairs) continue;
    const float* ws = p.ws + int64_t(pair) * 2 * p.inter + c;
    float4 gate = make_float4(0.f, 0.f, 0.f, 0.f), up = gate;
    for (int s = 0; s < p.splits; ++s) {
      const float4 gs = *reinterpret_cast<const float4*>(ws + s * stride);
      const float4 us = *reinterpret_cast<const float4*>(ws + s * stride + p.inter);
      gate.x += gs.x, gate.y += gs.y, gate.z += gs.z, gate.w += gs.w;
      up.x += us.x, up.y += us.y, up.z += us.z, up.w += us.w;
    }
    if (p.bias) {
      const int64_t e = p.expert_ids[r / kBlockM];
      const float2 g01 = bias2<T>(p.bias, e, 2 * p.inter, c), g23 = bias2<T>(p.bias, e, 2 * p.inter, c + 2);
      const float2 u01 = bias2<T>(p.bias, e, 2 * p.inter, p.inter + c),
                   u23 = bias2<T>(p.bias, e, 2 * p.inter, p.inter + c + 2);
      gate.x += g01.x, gate.y += g01.y, gate.z += g23.x, gate.w += g23.y;
      up.x += u01.x, up.y += u01.y, up.z += u23.x, up.w += u23.y;
    }
    T* out = static_cast<T*>(p.act) + int64_t(r) * p.inter + c;
    *reinterpret_cast<uint32_t*>(out) = pack2<T>(expert_act(p.fn, round_to<T>(gate.x), round_to<T>(up.x)),
                                                 expert_act(p.fn, round_to<T>(gate.y), round_to<T>(up.y)));
    *reinterpret_cast<uint32_t*>(out + 2) = pack2<T>(expert_act(p.fn, round_to<T>(gate.z), round_to<T>(up.z)),
                                                     expert_act(p.fn, round_to<T>(gate.w), round_to<T>(up.w)));
  }
}

struct SumSplitsParams {
  void* out;        // [num_tokens, hidden]
  const float* ws;  // [splits, num_pairs, hidden]
  const float* topk_weights;
  const int32_t* ids;
  const void* bias;  // [num_experts, hidden] or nullptr
  int num_tokens, hidden, top_k, splits, num_experts;
};

// out[t] = sum over t's valid pairs of round(weight * y), y = the sum of GEMM 2's splits (+ the expert's bias): moe_sum
// fused with the split reduction and the routing weight (pairs with an out-of-range expert id contribute zero, as when
// unsplit).
template <class T>
__global__ void __launch_bounds__(128) moe_sum_splits_kernel(SumSplitsParams p) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.hidden) return;
  const int64_t stride = int64_t(p.num_tokens) * p.top_k * p.hidden;
  for (int tok = blockIdx.y; tok < p.num_tokens; tok += gridDim.y) {
    float acc = 0.f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t pair = int64_t(tok) * p.top_k + j;
      const int id = p.ids[pair];
      if (id < 0 || id >= p.num_experts) continue;
      float y = 0.f;
      for (int s = 0; s < p.splits; ++s) y += p.ws[s * stride + pair * p.hidden + c];
      if (p.bias) y += to_f32(static_cast<const T*>(p.bias)[int64_t(id) * p.hidden + c]);
      acc += round_to<T>(p.topk_weights[pair] * y);
    }
    static_cast<T*>(p.out)[int64_t(tok) * p.hidden + c] = from_f32<T>(acc);
  }
}

namespace simt_path {

// A block computes a kTile x kTile output tile (mode 1: kTile act columns from kTile gate and kTile up rows), one
// value per thread, through kTile-deep shared-memory slices of A and B.
constexpr int kTile = 16;
static_assert(kBlockM % kTile == 0, "an m tile lies within one expert block");

template <class T, int kMode>
__global__ void __launch_bounds__(kTile* kTile) moe_expert_gemm_simt_kernel(GemmParams p, const T* a, const T* b) {
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1], us[kTile][kTile + 1];
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  if (r0 >= *p.post_padded) return;
  const int expert = p.expert_ids[r0 / kBlockM];
  const int tx = threadIdx.x, ty = threadIdx.y;
  float acc = 0.f, acc_up = 0.f;
  for (int k0 = 0; k0 < p.k; k0 += kTile) {
    const int kc = k0 + tx;
    as[ty][tx] = kc < p.k ? to_f32(a[int64_t(r0 + ty) * p.k + kc]) : 0.f;
    const bool row_ok = c0 + ty < p.n_out && kc < p.k;
    const int64_t brow = int64_t(expert) * p.b_rows + c0 + ty;
    bs[ty][tx] = row_ok ? to_f32(b[brow * p.k + kc]) : 0.f;
    if constexpr (kMode == 1) us[ty][tx] = row_ok ? to_f32(b[(brow + p.up_offset) * p.k + kc]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      acc += as[ty][i] * bs[tx][i];
      if constexpr (kMode == 1) acc_up += as[ty][i] * us[tx][i];
    }
    __syncthreads();
  }
  const int r = r0 + ty, col = c0 + tx;
  if (col >= p.n_out) return;
  const T* bias = static_cast<const T*>(p.bias) + int64_t(expert) * p.b_rows;
  if constexpr (kMode == 1) {
    if (p.bias) acc += to_f32(bias[col]), acc_up += to_f32(bias[p.up_offset + col]);
    static_cast<T*>(p.out)[int64_t(r) * p.n_out + col] =
        from_f32<T>(expert_act(p.act, round_to<T>(acc), round_to<T>(acc_up)));
  } else {
    if (p.bias) acc += to_f32(bias[col]);
    const int pair = p.sorted[r];
    if (pair < p.num_pairs)
      static_cast<T*>(p.out)[int64_t(pair) * p.n_out + col] = from_f32<T>(p.topk_weights[pair] * acc);
  }
}

}  // namespace simt_path

// ---- the decode path: a few tokens, each expert's rows streamed once as GEMVs ----
//
// At a handful of tokens the grouped GEMMs above are mostly padding (a 128-row block for each touched expert) and
// most of their time is the seven launches' ramps (alignment, permute, two GEMMs, their reduces, the sum), not the
// weight bytes. Up to kGemvMaxTokens tokens (and kGemvMaxPairs pairs) take two GEMV kernels instead, no alignment:
//   GEMM 1: block (column tile, pair p) acts for the expert e of pair p when p is e's first pair (the warp finds e's
//           pairs with two ballots over topk_ids; later pairs of e exit at once). Warp w streams e's gate row c and up
//           row c (c = its column) once and dots them with the hidden rows of every token routed to e, then writes
//           act(g, u) for each of those pairs: act [num_pairs, inter].
//   GEMM 2: one token: block (row tile) sums the token's top_k experts for its rows, weight by weight, straight into
//           out; more tokens: block (row tile, pair p) owns e's pairs as above, streams w2[e] row r once and writes
//           each pair's weighted row to cache [num_pairs, hidden], which moe_sum adds per token.
// Every weight byte a token batch touches is read once (as the grouped path does), with 16-byte loads kept in flight
// per lane; rounding points are the grouped path's (g, u, act, each weighted y in the activation dtype; the sum over
// top_k in fp32 in pair order).
constexpr int kGemvMaxTokens = 8, kGemvMaxPairs = 64, kGemvWarps = 4, kGemvUnroll = 4;

struct GemvParams {
  const void* x;  // [num_tokens, hidden]
  const void* w13;
  const void* w2;
  const void* w13_bias;  // or nullptr
  const void* w2_bias;   // or nullptr
  const float* topk_weights;
  const int32_t* ids;  // [num_pairs]
  void* act;           // [num_pairs, inter]
  void* out;           // one token: out [1, hidden]; else cache [num_pairs, hidden]
  const void* addend;  // one token: [1, hidden] added to the rounded sum (FusedExperts::forward_add), or nullptr
  ExpertAct fn;
  int num_pairs, top_k, hidden, inter, num_experts;
  bool prefetch;  // GEMM 2 prefetches its rows into L2 before its pdl_wait (only when launched early: dependent launch)
};

// Bit i set: pair i routes to `expert` (pairs below kGemvMaxPairs). The same in every lane.
__device__ __forceinline__ uint64_t pairs_of(const GemvParams& g, int expert) {
  const int lane = int(threadIdx.x % 32);
  const bool a = lane < g.num_pairs && g.ids[lane] == expert;
  const bool b = lane + 32 < g.num_pairs && g.ids[lane + 32] == expert;
  return uint64_t(__ballot_sync(0xffffffffu, a)) | uint64_t(__ballot_sync(0xffffffffu, b)) << 32;
}

// acc[r][i] += <row r, vec(i)> over `vectors` 16-byte vectors, for the n (<= kMaxN) vectors vec(i); lane l takes
// vectors l, l + 32, ... with kGemvUnroll loads of each row in flight before the math. Sums land in every lane.
template <class T, int kRows, int kMaxN, class Vec>
__device__ __forceinline__ void dot_rows(const uint4* const (&rows)[kRows], int vectors, int n, Vec vec,
                                         float (&acc)[kRows][kMaxN]) {
  const int lane = int(threadIdx.x % 32);
  int v = lane;
  for (; v + 32 * (kGemvUnroll - 1) < vectors; v += 32 * kGemvUnroll) {
    uint4 w[kRows][kGemvUnroll];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) w[r][u] = load_weight(rows[r] + v + 32 * u);
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      if (i >= n) break;
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const uint4 x = vec(i, v + 32 * u);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][i] = dot16<T>(w[r][u], x, acc[r][i]);
      }
    }
  }
  for (; v < vectors; v += 32) {
    uint4 w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w[r] = load_weight(rows[r] + v);
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      if (i >= n) break;
      const uint4 x = vec(i, v);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][i] = dot16<T>(w[r], x, acc[r][i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) {
    if (i >= n) break;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r][i] = warp_sum(acc[r][i]);
  }
}

// The pairs of `mask` from bit `from` on, at most kMaxN: their indices in pair[], the count returned.
template <int kMaxN>
__device__ __forceinline__ int next_pairs(uint64_t mask, int& from, int (&pair)[kMaxN]) {
  int n = 0;
  while (n < kMaxN && from < 64) {
    const uint64_t rest = mask >> from;
    if (rest == 0) {
      from = 64;
      break;
    }
    from += __ffsll(static_cast<long long>(rest)) - 1;
    pair[n++] = from++;
  }
  return n;
}

// GEMM 1 for the pairs of the block's expert, kMaxN of them per pass (a power of two >= the tokens: an expert has at
// most one pair per token unless a token lists it twice).
template <class T, int kMaxN>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_act_kernel(GemvParams g) {
  constexpr int N = 16 / int(sizeof(T));
  // Dependent launch (kbn/pdl.cuh): the routing ids and x come from the kernels before; GEMM 2 may be scheduled once
  // every block is past this wait (pdl_wait releases it), and prefetches its weight rows while this kernel finishes.
  pdl_wait();
  const int lane = int(threadIdx.x % 32), p = blockIdx.y;
  const int c = int(blockIdx.x) * kGemvWarps + int(threadIdx.x / 32);
  const int e = g.ids[p];
  if (e < 0 || e >= g.num_experts || c >= g.inter) return;
  const uint64_t mask = pairs_of(g, e);
  if (mask & ((uint64_t(1) << p) - 1)) return;  // an earlier pair owns the expert
  const T* w = static_cast<const T*>(g.w13) + int64_t(e) * 2 * g.inter * g.hidden;
  const uint4* const rows[2] = {reinterpret_cast<const uint4*>(w + int64_t(c) * g.hidden),
                                reinterpret_cast<const uint4*>(w + int64_t(g.inter + c) * g.hidden)};
  const T* bias = g.w13_bias ? static_cast<const T*>(g.w13_bias) + int64_t(e) * 2 * g.inter : nullptr;
  const float bg = bias ? to_f32(bias[c]) : 0.f, bu = bias ? to_f32(bias[g.inter + c]) : 0.f;
  const T* x = static_cast<const T*>(g.x);
  for (int from = p;;) {
    int pair[kMaxN];
    const int n = next_pairs<kMaxN>(mask, from, pair);
    if (n == 0) break;
    float acc[2][kMaxN] = {};
    dot_rows<T, 2, kMaxN>(
        rows, g.hidden / N, n,
        [&](int i, int v) {
          return __ldg(reinterpret_cast<const uint4*>(x + int64_t(pair[i] / g.top_k) * g.hidden) + v);
        },
        acc);
#pragma unroll
    for (int i = 0; i < kMaxN; ++i)
      if (i < n && lane == i)
        static_cast<T*>(g.act)[int64_t(pair[i]) * g.inter + c] =
            from_f32<T>(expert_act(g.fn, round_to<T>(acc[0][i] + bg), round_to<T>(acc[1][i] + bu)));
  }
}

// The first kPrefetchBytes of a weight row into L2, one 128-byte line per lane at a time: what GEMM 2 does before its
// pdl_wait while GEMM 1 finishes (its expert ids are final then: GEMM 1 released its launch after its own wait).
constexpr int64_t kPrefetchBytes = 4096;
__device__ __forceinline__ void prefetch_row_l2(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  const int64_t n = bytes < kPrefetchBytes ? bytes : kPrefetchBytes;
  for (int64_t off = int64_t(threadIdx.x % 32) * 128; off < n; off += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

// GEMM 2, more than one token: cache[pair, r] = round(w_pair (w2[e] row r . act[pair] + b2)) for the pairs of the
// block's expert (row r: the warp's); a dropped pair's row is zero.
template <class T, int kMaxN>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_down_kernel(GemvParams g) {
  constexpr int N = 16 / int(sizeof(T));
  const int lane = int(threadIdx.x % 32);
  const int r = int(blockIdx.x) * kGemvWarps + int(threadIdx.x / 32);
  if (r >= g.hidden) return;
  const int p = blockIdx.y, e = g.ids[p];
  T* out = static_cast<T*>(g.out);
  if (g.prefetch && e >= 0 && e < g.num_experts)
    prefetch_row_l2(static_cast<const T*>(g.w2) + (int64_t(e) * g.hidden + r) * g.inter, int64_t(g.inter) * sizeof(T));
  pdl_wait();  // act comes from GEMM 1
  if (e < 0 || e >= g.num_experts) {
    if (lane == 0) out[int64_t(p) * g.hidden + r] = from_f32<T>(0.f);
    return;
  }
  const uint64_t mask = pairs_of(g, e);
  if (mask & ((uint64_t(1) << p) - 1)) return;
  const uint4* const row[1] = {
      reinterpret_cast<const uint4*>(static_cast<const T*>(g.w2) + (int64_t(e) * g.hidden + r) * g.inter)};
  const float b = g.w2_bias ? to_f32(static_cast<const T*>(g.w2_bias)[int64_t(e) * g.hidden + r]) : 0.f;
  const T* act = static_cast<const T*>(g.act);
  for (int from = p;;) {
    int pair[kMaxN];
    const int n = next_pairs<kMaxN>(mask, from, pair);
    if (n == 0) break;
    float acc[1][kMaxN] = {};
    dot_rows<T, 1, kMaxN>(
        row, g.inter / N, n,
        [&](int i, int v) { return __ldg(reinterpret_cast<const uint4*>(act + int64_t(pair[i]) * g.inter) + v); }, acc);
#pragma unroll
    for (int i = 0; i < kMaxN; ++i)
      if (i < n && lane == i)
        out[int64_t(pair[i]) * g.hidden + r] = from_f32<T>(g.topk_weights[pair[i]] * (acc[0][i] + b));
  }
}

// GEMM 2, one token: out[r] = sum over its pairs j, in order, of round(w_j (w2[e_j] row r . act[j] + b2)), rounded,
// plus addend[r] when given (in fp32, rounded again: moe_sum's bits for the two terms). The pairs
// go kChunk at a time with their rows side by side, 8 / kChunk vectors of each in flight per lane; a dropped pair (id
// out of range) reads nothing and adds nothing.
template <class T, int kChunk>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_down_token_kernel(GemvParams g) {
  constexpr int N = 16 / int(sizeof(T)), kU = 8 / kChunk;
  const int lane = int(threadIdx.x % 32);
  const int r = int(blockIdx.x) * kGemvWarps + int(threadIdx.x / 32);
  if (r >= g.hidden) return;
  const int vectors = g.inter / N;
  for (int j = 0; g.prefetch && j < g.top_k; ++j) {
    const int id = g.ids[j];
    if (id >= 0 && id < g.num_experts)
      prefetch_row_l2(static_cast<const T*>(g.w2) + (int64_t(id) * g.hidden + r) * g.inter,
                      int64_t(g.inter) * sizeof(T));
  }
  pdl_wait();  // act comes from GEMM 1
  float sum = 0.f;
  for (int j0 = 0; j0 < g.top_k; j0 += kChunk) {
    const uint4* rows[kChunk];
    const uint4* acts[kChunk];
    int ids[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      ids[i] = j0 + i < g.top_k ? g.ids[j0 + i] : -1;
      if (ids[i] >= g.num_experts) ids[i] = -1;
      rows[i] = reinterpret_cast<const uint4*>(static_cast<const T*>(g.w2) +
                                               (int64_t(max(ids[i], 0)) * g.hidden + r) * g.inter);
      acts[i] = reinterpret_cast<const uint4*>(static_cast<const T*>(g.act) + int64_t(j0 + i) * g.inter);
    }
    float acc[kChunk] = {};
    for (int v0 = lane; v0 < vectors; v0 += 32 * kU) {
      uint4 w[kU][kChunk];
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
          if (ids[i] >= 0 && v0 + 32 * u < vectors) w[u][i] = load_weight(rows[i] + v0 + 32 * u);
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
          if (ids[i] >= 0 && v0 + 32 * u < vectors) acc[i] = dot16<T>(w[u][i], __ldg(acts[i] + v0 + 32 * u), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (ids[i] >= 0) {
        const float b = g.w2_bias ? to_f32(static_cast<const T*>(g.w2_bias)[int64_t(ids[i]) * g.hidden + r]) : 0.f;
        sum += round_to<T>(g.topk_weights[j0 + i] * (warp_sum(acc[i]) + b));
      }
  }
  if (lane == 0)
    static_cast<T*>(g.out)[r] =
        from_f32<T>(g.addend ? round_to<T>(sum) + to_f32(static_cast<const T*>(g.addend)[r]) : sum);
}

struct ExpertsLaunch {
  const void* x;
  const void* w13;
  const void* w2;
  const float* topk_weights;
  const int32_t* topk_ids;
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* post_padded;
  void* x_sorted;  // [max_padded, hidden]
  void* act;       // [max_padded, inter]
  void* cache;     // [num_pairs, hidden]
  void* out;       // [num_tokens, hidden]: written here only when GEMM 2 is split (its reduce kernel sums the pairs)
  const void* w13_bias;  // [num_experts, 2 * inter] or nullptr
  const void* w2_bias;   // [num_experts, hidden] or nullptr
  ExpertAct act_fn;
  int num_pairs, top_k, hidden, inter, num_experts, max_padded;
};

// Wave efficiency of `items` equal work items over `slots` concurrent blocks: the fraction of the last wave's time
// the slots spend busy, summed over the waves.
double wave_efficiency(double items, int slots) {
  const double waves = items / slots;
  return waves / std::ceil(waves);
}

// K splits of one expert GEMM: 1 unless its tiles leave SMs idle in the last wave; then the count (up to 8, keeping
// at least 4 k blocks per split and the workspace under 64 MiB) that best fills the waves, each extra split charged
// 3% for its partial-sum traffic and the reduce. The active blocks are estimated from the shapes (no host sync): the
// experts a uniform routing touches, E (1 - (1 - k / E)^tokens), plus one block per kBlockM pairs.
int choose_splits(const ExpertsLaunch& l, int n_tiles, int k, int ws_cols, int num_sms) {
  const double tokens = double(l.num_pairs) / l.top_k, e = l.num_experts;
  const double touched = e * (1.0 - std::pow(1.0 - double(l.top_k) / e, tokens));
  const double items = std::min(double(l.max_padded / kBlockM), touched + double(l.num_pairs / kBlockM)) * n_tiles;
  if (items >= 8.0 * num_sms) return 1;
  const int num_kb = (k + kBlockK - 1) / kBlockK;
  int best = 1;
  double best_score = wave_efficiency(items, num_sms);
  for (int s = 2; s <= 8 && num_kb / s >= 4; ++s) {
    if (double(s) * l.num_pairs * ws_cols * 4 > 64.0 * (1 << 20)) break;
    const double score = wave_efficiency(items * s, num_sms) - 0.03 * (s - 1);
    if (score > best_score + 1e-9) best = s, best_score = score;
  }
  return best;
}

// The two Hopper GEMMs with kBlockN-wide tiles, each split along K as choose_splits says (with its reduce kernel);
// false (nothing launched) when a tensor map cannot be made. `summed`: GEMM 2 was split and its reduce wrote l.out.
template <class T, int kBlockN>
bool launch_hopper_gemms(const ExpertsLaunch& l, GemmParams g1, GemmParams g2, DType dt, int device, int num_sms,
                         Stream stream, bool& summed) {
  using namespace hopper_path;
  using Cfg = Tile<kBlockN>;
  auto* k1 = moe_expert_gemm_tma_kernel<T, 1, kBlockN>;
  auto* k2 = moe_expert_gemm_tma_kernel<T, 2, kBlockN>;
  CUtensorMap a1{}, b1{}, a2{}, b2{};
  const int64_t e = l.num_experts;
  if (!encode_matrix_map(a1, l.x_sorted, dt, l.max_padded, l.hidden, kABoxRows) ||
      !encode_matrix_map(b1, l.w13, dt, e * 2 * l.inter, l.hidden, kBlockN / 2) ||
      !encode_matrix_map(a2, l.act, dt, l.max_padded, l.inter, kABoxRows) ||
      !encode_matrix_map(b2, l.w2, dt, e * l.hidden, l.inter, kBlockN))
    return false;
  (void)kernel_launch_facts(reinterpret_cast<const void*>(k1), device, kThreads, Cfg::kSmemBytes);  // smem opt-in
  (void)kernel_launch_facts(reinterpret_cast<const void*>(k2), device, kThreads, Cfg::kSmemBytes);
  g1.n_tiles = (l.inter + kBlockN / 2 - 1) / (kBlockN / 2);
  g2.n_tiles = (l.hidden + kBlockN - 1) / kBlockN;
  // Split K where the tiles would leave SMs idle (the workspaces live until the stream has used them: the allocator
  // is stream-ordered).
  Tensor ws1, ws2;
  const Device dev = Device::cuda(device);
  auto split = [&](GemmParams& g, int ws_cols, Tensor& ws) {
    const int num_kb = (g.k + kBlockK - 1) / kBlockK;
    const int s = choose_splits(l, g.n_tiles, g.k, ws_cols, num_sms);
    g.kb_per_split = (num_kb + s - 1) / s;
    g.splits = (num_kb + g.kb_per_split - 1) / g.kb_per_split;  // no empty split
    if (g.splits > 1) {
      ws = Tensor::empty({g.splits, l.num_pairs, ws_cols}, DType::f32, dev);
      g.ws = ws.data<float>();
    }
  };
  split(g1, 2 * l.inter, ws1);
  split(g2, l.hidden, ws2);
  // Narrow-tile and split GEMMs (decode sizes) run a persistent grid, one block per SM; wide ones a block per item.
  auto grid = [&](const GemmParams& g) {
    const int64_t items = int64_t(g.m_blocks) * g.n_tiles * g.splits;
    const bool persistent = g.splits > 1 || kBlockN == 128;
    return unsigned(persistent ? std::min<int64_t>(num_sms, items) : items);
  };
  k1<<<grid(g1), kThreads, Cfg::kSmemBytes, stream>>>(g1, a1, b1);
  KBN_CUDA_CHECK_LAUNCH();
  if (g1.splits > 1) {
    const ActSplitsParams sp{.act = l.act,
                             .ws = g1.ws,
                             .sorted = l.sorted,
                             .expert_ids = l.expert_ids,
                             .post_padded = l.post_padded,
                             .bias = l.w13_bias,
                             .fn = l.act_fn,
                             .num_pairs = l.num_pairs,
                             .inter = l.inter,
                             .splits = g1.splits};
    const int col_blocks = (l.inter / 4 + 127) / 128;
    const dim3 grid_act{unsigned(col_blocks), unsigned(std::min(l.max_padded, std::max(1, 2048 / col_blocks)))};
    moe_act_mul_splits_kernel<T><<<grid_act, 128, 0, stream>>>(sp);
    KBN_CUDA_CHECK_LAUNCH();
  }
  k2<<<grid(g2), kThreads, Cfg::kSmemBytes, stream>>>(g2, a2, b2);
  KBN_CUDA_CHECK_LAUNCH();
  summed = g2.splits > 1;
  if (summed) {
    const int tokens = l.num_pairs / l.top_k;
    const SumSplitsParams sp{.out = l.out,
                             .ws = g2.ws,
                             .topk_weights = l.topk_weights,
                             .ids = l.topk_ids,
                             .bias = l.w2_bias,
                             .num_tokens = tokens,
                             .hidden = l.hidden,
                             .top_k = l.top_k,
                             .splits = g2.splits,
                             .num_experts = l.num_experts};
    const dim3 grid_sum{unsigned((l.hidden + 127) / 128), unsigned(std::min(tokens, 65535))};
    moe_sum_splits_kernel<T><<<grid_sum, 128, 0, stream>>>(sp);
    KBN_CUDA_CHECK_LAUNCH();
  }
  return true;
}

// Returns true when the output is already summed into l.out (GEMM 2 split); otherwise l.cache holds the pairs' rows.
template <class T>
bool launch_fused_experts(const ExpertsLaunch& l, DType dt, Stream stream) {
  // 2. gather the rows into expert order
  const PermuteParams pp{.x_sorted = l.x_sorted,
                         .cache = l.cache,
                         .x = l.x,
                         .sorted = l.sorted,
                         .post_padded = l.post_padded,
                         .ids = l.topk_ids,
                         .num_pairs = l.num_pairs,
                         .top_k = l.top_k,
                         .hidden = l.hidden,
                         .num_experts = l.num_experts};
  const bool vec = l.hidden % Vec16<T>::N == 0 && reinterpret_cast<uintptr_t>(l.x) % 16 == 0;
  if (vec)
    moe_permute_kernel<T, true><<<l.max_padded / kPermuteRows, 128, 0, stream>>>(pp);
  else
    moe_permute_kernel<T, false><<<l.max_padded / kPermuteRows, 128, 0, stream>>>(pp);
  KBN_CUDA_CHECK_LAUNCH();

  const int m_blocks = l.max_padded / kBlockM;
  GemmParams g1{.sorted = l.sorted,
                .expert_ids = l.expert_ids,
                .post_padded = l.post_padded,
                .topk_weights = l.topk_weights,
                .out = l.act,
                .num_pairs = l.num_pairs,
                .n_out = l.inter,
                .b_rows = 2 * l.inter,
                .up_offset = l.inter,
                .k = l.hidden,
                .m_blocks = m_blocks,
                .n_tiles = 0,
                .splits = 1,
                .kb_per_split = 1 << 30,
                .ws = nullptr,
                .bias = l.w13_bias,
                .act = l.act_fn};
  GemmParams g2 = g1;
  g2.bias = l.w2_bias;
  g2.out = l.cache;
  g2.n_out = l.hidden;
  g2.b_rows = l.hidden;
  g2.up_offset = 0;
  g2.k = l.inter;

  // 3-4. the expert GEMMs
  if constexpr (!std::is_same_v<T, float>) {
    int device = 0;
    KBN_CUDA_CHECK(cudaGetDevice(&device));
    const auto* narrow = reinterpret_cast<const void*>(hopper_path::moe_expert_gemm_tma_kernel<T, 1, 128>);
    if (runs_sm90_image(narrow, device)) {
      // Wide tiles once the full m blocks alone give GEMM 2 two waves of blocks (prefill); narrow ones below that.
      // The SM count comes from the launch facts cached per kernel and device (no driver query per call).
      const int num_sms =
          kernel_launch_facts(narrow, device, hopper_path::kThreads, hopper_path::Tile<128>::kSmemBytes).num_sms;
      const bool wide = int64_t(l.num_pairs / kBlockM) * ((l.hidden + 255) / 256) >= 2 * int64_t(num_sms);
      bool summed = false;
      if (wide ? launch_hopper_gemms<T, 256>(l, g1, g2, dt, device, num_sms, stream, summed)
               : launch_hopper_gemms<T, 128>(l, g1, g2, dt, device, num_sms, stream, summed))
        return summed;
    }
  }
  using simt_path::kTile;
  const dim3 block{kTile, kTile};
  const dim3 grid1{unsigned((l.inter + kTile - 1) / kTile), unsigned(l.max_padded / kTile)};
  simt_path::moe_expert_gemm_simt_kernel<T, 1>
      <<<grid1, block, 0, stream>>>(g1, static_cast<const T*>(l.x_sorted), static_cast<const T*>(l.w13));
  KBN_CUDA_CHECK_LAUNCH();
  const dim3 grid2{unsigned((l.hidden + kTile - 1) / kTile), unsigned(l.max_padded / kTile)};
  simt_path::moe_expert_gemm_simt_kernel<T, 2>
      <<<grid2, block, 0, stream>>>(g2, static_cast<const T*>(l.act), static_cast<const T*>(l.w2));
  KBN_CUDA_CHECK_LAUNCH();
  return false;
}

// Whether the decode path takes a launch: few tokens and pairs, rows of whole 16-byte vectors, aligned operands.
bool gemv_path_applies(int64_t tokens, int64_t pairs, int64_t hidden, int64_t inter, DType dt,
                       std::initializer_list<const void*> operands) {
  const int64_t n = 16 / int64_t(dtype_size(dt));
  if (tokens > kGemvMaxTokens || pairs > kGemvMaxPairs || hidden % n != 0 || inter % n != 0) return false;
  for (const void* ptr : operands)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  return true;
}

// The decode path's two kernels; returns the [tokens, top_k, hidden] rows for moe_sum, or undefined when one token's
// rows were summed into `out` directly.
template <class T>
Tensor launch_gemv_experts(GemvParams g, int64_t tokens, void* out, DType dt, Device device, Stream stream) {
  Tensor act = Tensor::empty({g.num_pairs, g.inter}, dt, device);
  g.act = act.data_ptr();
  const unsigned col_tiles = unsigned((g.inter + kGemvWarps - 1) / kGemvWarps);
  const unsigned row_tiles = unsigned((g.hidden + kGemvWarps - 1) / kGemvWarps);
  constexpr unsigned kThreadsPerBlock = kGemvWarps * 32;
  Tensor cache;
  dispatch_pow2<kGemvMaxTokens>(tokens, [&](auto max_n) {
    launch_pdl(moe_gemv_act_kernel<T, max_n()>, dim3(col_tiles, unsigned(g.num_pairs)), dim3(kThreadsPerBlock), 0,
               stream, g);
    if (tokens > 1) {
      cache = Tensor::empty({tokens, g.top_k, g.hidden}, dt, device);
      g.out = cache.data_ptr();
      launch_pdl(moe_gemv_down_kernel<T, max_n()>, dim3(row_tiles, unsigned(g.num_pairs)), dim3(kThreadsPerBlock), 0,
                 stream, g);
    }
  });
  if (tokens == 1) {
    g.out = out;
    dispatch_pow2<8>(std::min<int64_t>(g.top_k, 8), [&](auto chunk) {
      launch_pdl(moe_gemv_down_token_kernel<T, chunk()>, dim3(row_tiles, 1), dim3(kThreadsPerBlock), 0, stream, g);
    });
  }
  return cache;
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FusedExperts::FusedExperts(Activation activation, double alpha, double limit)
    : activation_(activation), alpha_(alpha), limit_(limit) {
  reference::check_expert_activation("FusedExperts", {.activation = activation, .alpha = alpha, .limit = limit});
}

Tensor FusedExperts::forward(const Tensor& hidden_states, const Tensor& w13, const Tensor& w2,
                             const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13_bias,
                             const Tensor& w2_bias) {
  return run(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, Tensor());
}

Tensor FusedExperts::forward_add(const Tensor& addend, const Tensor& hidden_states, const Tensor& w13,
                                 const Tensor& w2, const Tensor& topk_weights, const Tensor& topk_ids,
                                 const Tensor& w13_bias, const Tensor& w2_bias) {
  constexpr const char* kOp = "fused_experts";
  KBN_CHECK(addend.defined(), kOp, ": argument 'addend' must be a tensor [num_tokens, hidden], got an undefined one");
  return run(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, addend);
}

// The experts' output; with `addend` defined (forward_add), round(output + addend).
Tensor FusedExperts::run(const Tensor& hidden_states, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
                         const Tensor& topk_ids, const Tensor& w13_bias, const Tensor& w2_bias,
                         const Tensor& addend) {
  constexpr const char* kOp = "fused_experts";
  // round(out + addend) as a two-term moe_sum: where no kernel took the addend in.
  const auto plus_addend = [&](const Tensor& out) {
    if (!addend.defined()) return out;
    Tensor both = Tensor::empty({out.size(0), 2, out.size(1)}, out.dtype(), out.device());
    both.select(1, 0).copy_(out);
    both.select(1, 1).copy_(addend);
    return MoeSum().forward(both);
  };
  check_rank(hidden_states, kOp, "hidden_states", 2, "[num_tokens, hidden]");
  check_dtype(hidden_states, kOp, "hidden_states", {DType::f32, DType::f16, DType::bf16});
  check_contiguous(hidden_states, kOp, "hidden_states");
  check_rank(w13, kOp, "w13", 3, "[num_experts, 2 * inter, hidden]");
  check_rank(w2, kOp, "w2", 3, "[num_experts, hidden, inter]");
  check_same_dtype(hidden_states, w13, kOp, "hidden_states", "w13");
  check_same_dtype(hidden_states, w2, kOp, "hidden_states", "w2");
  check_contiguous(w13, kOp, "w13");
  check_contiguous(w2, kOp, "w2");
  const int64_t t = hidden_states.size(0), h = hidden_states.size(1), e = w13.size(0);
  if (addend.defined()) {
    check_rank(addend, kOp, "addend", 2, "[num_tokens, hidden]");
    check_size(addend, kOp, "addend", 0, t, "num_tokens");
    check_size(addend, kOp, "addend", 1, h, "hidden");
    check_contiguous(addend, kOp, "addend");
    check_same_dtype(hidden_states, addend, kOp, "hidden_states", "addend");
    check_same_device(hidden_states, addend, kOp, "hidden_states", "addend");
  }
  KBN_CHECK(w13.size(1) % 2 == 0 && w13.size(1) > 0, kOp,
            ": argument 'w13' [num_experts, 2 * inter, hidden] needs a positive even dim 1, got ", w13.str());
  const int64_t inter = w13.size(1) / 2;
  check_size(w13, kOp, "w13", 2, h, "hidden");
  check_size(w2, kOp, "w2", 0, e, "num_experts");
  check_size(w2, kOp, "w2", 1, h, "hidden");
  check_size(w2, kOp, "w2", 2, inter, "inter");
  check_rank(topk_ids, kOp, "topk_ids", 2, "[num_tokens, top_k]");
  check_dtype(topk_ids, kOp, "topk_ids", {DType::i32});
  check_contiguous(topk_ids, kOp, "topk_ids");
  check_size(topk_ids, kOp, "topk_ids", 0, t, "num_tokens");
  const int64_t k = topk_ids.size(1);
  check_rank(topk_weights, kOp, "topk_weights", 2, "[num_tokens, top_k]");
  check_dtype(topk_weights, kOp, "topk_weights", {DType::f32});
  check_contiguous(topk_weights, kOp, "topk_weights");
  check_size(topk_weights, kOp, "topk_weights", 0, t, "num_tokens");
  check_size(topk_weights, kOp, "topk_weights", 1, k, "top_k");
  for (const auto& [arg, tensor] : {std::pair{"w13", &w13}, std::pair{"w2", &w2},
                                    std::pair{"topk_weights", &topk_weights}, std::pair{"topk_ids", &topk_ids}})
    check_same_device(hidden_states, *tensor, kOp, "hidden_states", arg);
  KBN_CHECK(k >= 1 && k <= e, kOp, ": argument 'topk_ids' ", topk_ids.str(), " must choose 1 to num_experts (", e,
            ") experts per token");
  const reference::ExpertFeatures features{.activation = activation_,
                                           .alpha = alpha_,
                                           .limit = limit_,
                                           .w13_bias = w13_bias.defined() ? &w13_bias : nullptr,
                                           .w2_bias = w2_bias.defined() ? &w2_bias : nullptr};
  reference::check_expert_features(kOp, features, e, inter, h, hidden_states.dtype());
  for (const auto& [arg, tensor] : {std::pair{"w13_bias", &w13_bias}, std::pair{"w2_bias", &w2_bias}}) {
    if (!tensor->defined()) continue;
    check_contiguous(*tensor, kOp, arg);
    check_same_device(hidden_states, *tensor, kOp, "hidden_states", arg);
  }

  Tensor out = Tensor::empty({t, h}, hidden_states.dtype(), hidden_states.device());
  if (hidden_states.is_cpu()) {
    reference::fused_experts(out, hidden_states, w13, w2, topk_weights, topk_ids, features);
    return plus_addend(out);
  }
  if (t == 0) return out;
#ifdef KBN_WITH_CUDA
  const int64_t pairs = t * k;
  const DType dt = hidden_states.dtype();
  const Device d = hidden_states.device();
  const ExpertAct act_fn{
      .swigluoai = activation_ == Activation::swigluoai, .alpha = float(alpha_), .limit = float(limit_)};
  if (gemv_path_applies(t, pairs, h, inter, dt, {hidden_states.data_ptr(), w13.data_ptr(), w2.data_ptr()})) {
    const GemvParams g{.x = hidden_states.data_ptr(),
                       .w13 = w13.data_ptr(),
                       .w2 = w2.data_ptr(),
                       .w13_bias = w13_bias.defined() ? w13_bias.data_ptr() : nullptr,
                       .w2_bias = w2_bias.defined() ? w2_bias.data_ptr() : nullptr,
                       .topk_weights = topk_weights.data<float>(),
                       .ids = topk_ids.data<int32_t>(),
                       .act = nullptr,
                       .out = nullptr,
                       .addend = t == 1 && addend.defined() ? addend.data_ptr() : nullptr,
                       .fn = act_fn,
                       .num_pairs = int(pairs),
                       .top_k = int(k),
                       .hidden = int(h),
                       .inter = int(inter),
                       .num_experts = int(e),
                       .prefetch = dependent_launch_enabled()};
    Tensor cache;
    dispatch_float16_32(dt, kOp, "hidden_states", [&](auto tag) {
      cache = launch_gemv_experts<decltype(tag)>(g, t, out.data_ptr(), dt, d, current_stream());
    });
    if (cache.defined()) return plus_addend(MoeSum().forward(cache));
    return g.addend ? out : plus_addend(out);
  }
  const int64_t padded = MoeAlignBlockSize::max_padded(pairs, kBlockM, e);
  KBN_CHECK(padded * std::max(h, inter) <= std::numeric_limits<int32_t>::max() &&
                e * std::max(2 * inter, h) <= std::numeric_limits<int32_t>::max(),
            kOp, ": shapes too large for 32-bit row indices: hidden_states ", hidden_states.str(), ", w13 ", w13.str(),
            ", top_k ", k);
  auto [sorted, expert_ids, post] = MoeAlignBlockSize(kBlockM, e).forward(topk_ids);
  Tensor x_sorted = Tensor::empty({padded, h}, dt, d);
  Tensor act = Tensor::empty({padded, inter}, dt, d);
  Tensor cache = Tensor::empty({t, k, h}, dt, d);
  const ExpertsLaunch l{.x = hidden_states.data_ptr(),
                        .w13 = w13.data_ptr(),
                        .w2 = w2.data_ptr(),
                        .topk_weights = topk_weights.data<float>(),
                        .topk_ids = topk_ids.data<int32_t>(),
                        .sorted = sorted.data<int32_t>(),
                        .expert_ids = expert_ids.data<int32_t>(),
                        .post_padded = post.data<int32_t>(),
                        .x_sorted = x_sorted.data_ptr(),
                        .act = act.data_ptr(),
                        .cache = cache.data_ptr(),
                        .out = out.data_ptr(),
                        .w13_bias = w13_bias.defined() ? w13_bias.data_ptr() : nullptr,
                        .w2_bias = w2_bias.defined() ? w2_bias.data_ptr() : nullptr,
                        .act_fn = act_fn,
                        .num_pairs = int(pairs),
                        .top_k = int(k),
                        .hidden = int(h),
                        .inter = int(inter),
                        .num_experts = int(e),
                        .max_padded = int(padded)};
  bool summed = false;
  dispatch_float16_32(dt, kOp, "hidden_states",
                      [&](auto tag) { summed = launch_fused_experts<decltype(tag)>(l, dt, current_stream()); });
  if (!summed) out = MoeSum().forward(cache);
  out = plus_addend(out);
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
