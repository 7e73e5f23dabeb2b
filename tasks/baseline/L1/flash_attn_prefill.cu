#include "L1/flash_attn_prefill.h"

#include <cmath>
#include <utility>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_fp8.h>

#include "L1/attention_generic.cuh"
#include "L1/attention_mma.cuh"
#include "L1/mbarrier.cuh"
#include "L1/tma.cuh"
#include "L1/wgmma.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, element strides, a params struct, a stream ----

struct PrefillParams {
  const void* q;               // [num_tokens, num_heads, head_size], last dim contiguous
  const void* key_cache;       // [num_blocks, block_size, num_kv_heads, head_size], last dim contiguous
  const void* value_cache;     // [num_blocks, block_size, num_kv_heads, head_size], last dim contiguous
  void* out;                   // [num_tokens, num_heads, head_size], last dim contiguous
  const int* query_start_loc;  // [num_seqs + 1]
  const int* seq_lens;         // [num_seqs]
  const int* block_tables;     // [num_seqs, max_blocks_per_seq] row stride block_table_stride
  int64_t q_stride_token, q_stride_head;
  int64_t out_stride_token, out_stride_head;
  int64_t k_stride_block, k_stride_slot, k_stride_head;
  int64_t v_stride_block, v_stride_slot, v_stride_head;
  int64_t block_table_stride;
  int block_size;
  int block_shift;   // log2(block_size) when it is a power of two, else -1
  int group_size;    // query heads per kv head
  float scale_log2;  // softmax scale * log2(e): scores live in the exp2 domain
  AttnFeatures feat;  // sliding window, soft cap, sinks (attention_mma.cuh)
};

namespace mma_path {

// Tile shape. A block owns kBlockM packed query rows of one kv head; row m of a sequence is (token m / group,
// query head kv_head * group + m % group), so the heads that share a kv head share every K/V tile load.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = kWarps * 16;  // one warp per 16 query rows (the M of one mma)
constexpr int kBlockN = 64;           // keys per K/V tile
// K/V tiles in flight (cp.async ring): three, or two at head 256, whose three would not fit beside the Q tile
// (128 x 256 + 3 x 2 x 64 x 256 16-bit values = 256 KB; two: 192 KB).
template <int kHeadDim>
constexpr int kStages = kHeadDim > 192 ? 2 : 3;

// FlashAttention-2 forward over a paged KV cache, causal, varlen, GQA-packed.
// grid = (num_kv_heads, query row tiles, num_seqs); block = kThreads; dynamic smem = Q tile + kStages K/V tiles.
// Each warp keeps 16 query rows: S = Q K^T for a 64-key tile in registers (mma m16n8k16, fp32), online softmax in
// the exp2 domain (running max / sum per row, 4 lanes per row), then O += P V with P re-packed from the S
// accumulators as the A operand (no trip through shared memory).
//
// The kernel for GPUs other than Hopper (sm_80 and later), and for caches whose pages TMA cannot copy as boxes:
// Hopper runs hopper_path's kernel below.
// NOTE: where the next gains are (measure first):
//  - Split the cp.async group per tile into K and V so S = Q K^T starts while V is still landing.
//  - 32 query rows per warp (two m16 atoms) would halve the shared-memory traffic per mma for K and V (the
//    ldmatrix bandwidth, not the tensor cores, bounds this kernel near 60% of the mma.sync rate), at the cost of
//    a second O accumulator (255 registers, as in FlashAttention-2).
//  - Keep Q fragments in registers when the register budget allows (they are re-read by ldmatrix every tile now).
//  - Key-row address generation (block-table read + div/mod by block_size) is done per chunk by every loading
//    thread; a power-of-two block_size specialisation (shift/mask) or one lookup per row shared through shared
//    memory would trim the integer work per tile.
//  - Causal load balance: query tiles are issued heaviest-first per (seq, kv head); a persistent-kernel tile
//    scheduler across sequences would remove the remaining tail for very uneven varlen batches.
//
// KV is the pages' type: T, or __nv_fp8_e4m3 (--kv-cache-dtype fp8_e4m3, scale 1.0; on Hopper at heads 192 and 256,
// where the TMA kernel has no room for fp8 tiles). fp8 tiles land dense in their own kStages ring (16-byte cp.async,
// 16 values each); once a tile has landed every thread widens its share to f16 (exact) into the one 16-bit K and V
// tile the mma code reads, behind a second barrier. The mmas then run in f16 whatever T is (P keeps 11 bits), with a bf16 Q tile rounded to
// f16 in place once it has landed (exact for bf16 values in f16's normal range; beyond +-65504 it becomes inf and the
// output NaN, never a silently clipped score); the output is T.
template <int kHeadDim, class T, class KV>
constexpr size_t prefill_mma_smem_bytes() {
  constexpr bool kConvert = !std::is_same_v<KV, T>;
  constexpr size_t kTileElems = size_t(kBlockN) * kHeadDim;
  // Q and the 16-bit K/V tiles (a ring of them for 16-bit pages, one pair for fp8), then the fp8 ring.
  return (size_t(kBlockM) * kHeadDim + 2 * (kConvert ? 1 : kStages<kHeadDim>) * kTileElems) * 2 +
         (kConvert ? 2 * kStages<kHeadDim> * kTileElems : 0);
}

template <class T, class KV, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1) flash_attn_prefill_mma_kernel(PrefillParams p) {
  constexpr bool kConvert = !std::is_same_v<KV, T>;
  static_assert(!kConvert || std::is_same_v<KV, __nv_fp8_e4m3>, "16-bit pages of q's type, or fp8 e4m3");
  using M = std::conditional_t<kConvert, __half, T>;  // the mmas' input type
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per 16-bit row
  constexpr int kChunks8 = kHeadDim / 16;  // 16-byte chunks per fp8 row
  constexpr int kTileElems = kBlockN * kHeadDim;
  constexpr int kTiles16 = kConvert ? 1 : kStages<kHeadDim>;  // 16-bit K (and V) tiles the mma code reads
  static_assert(kBlockN * kChunks % kThreads == 0 && kBlockM * kChunks % kThreads == 0, "whole copy rounds");
  static_assert(!kConvert || kBlockN * kChunks8 % kThreads == 0, "whole fp8 copy rounds");

  extern __shared__ __align__(16) unsigned char smem[];
  M* q_smem = reinterpret_cast<M*>(smem);           // [kBlockM, kHeadDim] (q's values as M)
  M* k_smem = q_smem + kBlockM * kHeadDim;          // [kTiles16, kBlockN, kHeadDim]
  M* v_smem = k_smem + kTiles16 * kTileElems;       // [kTiles16, kBlockN, kHeadDim]
  // fp8 pages: [kStages<kHeadDim>][K tile, V tile] of dense kBlockN x kHeadDim byte rows.
  unsigned char* ring8 = reinterpret_cast<unsigned char*>(v_smem + kTiles16 * kTileElems);

  const int kv_head = blockIdx.x;
  const int seq = blockIdx.z;
  const int m_tile = gridDim.y - 1 - blockIdx.y;  // heaviest (longest causal span) tiles first
  const int group = p.group_size;
  const int q_begin = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q_begin;
  const int num_rows = q_len * group;
  const int m0 = m_tile * kBlockM;
  if (m0 >= num_rows) return;

  const int seq_len = p.seq_lens[seq];
  const int offset = seq_len - q_len;  // query token j sits at key position offset + j
  const int first_token = m0 / group;
  const int last_token = min((m0 + kBlockM - 1) / group, q_len - 1);
  const int key_end = last_token + offset + 1;        // keys [0, key_end) are visible to some row of the tile
  const int unmasked_end = first_token + offset + 1;  // keys [0, unmasked_end) are visible to every row
  // A sliding window: keys [key_begin, key_end) are visible to some row, keys at or past window_full to every row
  // (as far as the window goes). The tiles start at key_begin: keys before it are never loaded.
  const int key_begin = max(window_first_key(p.feat, first_token + offset), 0);
  const int window_full = window_first_key(p.feat, last_token + offset);
  const int num_tiles = key_end > key_begin ? ceil_div(key_end - key_begin, kBlockN) : 0;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const T* q = static_cast<const T*>(p.q);
  const KV* k_head = static_cast<const KV*>(p.key_cache) + kv_head * p.k_stride_head;
  const KV* v_head = static_cast<const KV*>(p.value_cache) + kv_head * p.v_stride_head;
  const int* block_table = p.block_tables + int64_t(seq) * p.block_table_stride;

  // Q tile: rows past the sequence's last token are zero-filled.
#pragma unroll
  for (int j = 0; j < kBlockM * kChunks / kThreads; ++j) {
    const int i = tid + j * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const int m = m0 + r;
    const bool valid = m < num_rows;
    const T* src = q;
    if (valid) {
      const int token = q_begin + m / group;
      const int head = kv_head * group + m % group;
      src = q + token * p.q_stride_token + head * p.q_stride_head + c * 8;
    }
    cp_async_16(smem_addr(q_smem + swizzle<kHeadDim>(r, c)), src, valid);
  }

  // K and V tile `tile` into stage `stage` (tiles start at key_begin); keys at or past key_end (never visible,
  // possibly unallocated pages) are zero-filled so that masked probabilities multiply zeros, not garbage.
  auto load_kv = [&](int tile, int stage) {
    constexpr int kRowChunks = kConvert ? kChunks8 : kChunks;  // 16-byte chunks per page row
    constexpr int kChunkValues = 16 / int(sizeof(KV));
    const int n0 = key_begin + tile * kBlockN;
#pragma unroll
    for (int j = 0; j < kBlockN * kRowChunks / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i / kRowChunks, c = i % kRowChunks;
      const int key = n0 + r;
      const bool valid = key < key_end;
      const KV* k_src = k_head;
      const KV* v_src = v_head;
      if (valid) {
        const int64_t block = block_table[key / p.block_size];
        const int64_t slot = key % p.block_size;
        k_src = k_head + block * p.k_stride_block + slot * p.k_stride_slot + c * kChunkValues;
        v_src = v_head + block * p.v_stride_block + slot * p.v_stride_slot + c * kChunkValues;
      }
      // 16-bit pages straight into the stage's swizzled tiles; fp8 pages as dense rows of the fp8 ring.
      uint32_t k_dst, v_dst;
      if constexpr (kConvert) {
        k_dst = smem_addr(ring8 + stage * 2 * kTileElems + r * kHeadDim + c * 16);
        v_dst = k_dst + kTileElems;
      } else {
        k_dst = smem_addr(k_smem + stage * kTileElems + swizzle<kHeadDim>(r, c));
        v_dst = smem_addr(v_smem + stage * kTileElems + swizzle<kHeadDim>(r, c));
      }
      cp_async_16(k_dst, k_src, valid);
      cp_async_16(v_dst, v_src, valid);
    }
  };

  // Prologue: kStages<kHeadDim> - 1 commit groups (the first also holds Q); empty groups keep the count uniform.
#pragma unroll
  for (int stage = 0; stage < kStages<kHeadDim> - 1; ++stage) {
    if (stage < num_tiles) load_kv(stage, stage);
    cp_async_commit();
  }

  // Per-thread rows: g and g + 8 of this warp's 16. Rows past the last token clamp to it (never stored).
  const int g = lane / 4, t4 = lane % 4;
  int row_last_key[2], row_first_key[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = m0 + warp * 16 + g + 8 * r;
    row_last_key[r] = min(m / group, q_len - 1) + offset;
    row_first_key[r] = window_first_key(p.feat, row_last_key[r]);
  }
  const bool soft_cap = p.feat.cap_in > 0.f;
  const float score_scale = soft_cap ? 1.f : p.scale_log2;  // soft-capped scores are in the exp2 domain already

  float o[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // exp2 domain
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sums; reduced over the quad at the end

  // ldmatrix lane addressing (see ldmatrix_x4): A of Q rows, B of K rows (non-transposed), B of V rows (transposed).
  const int a_row = warp * 16 + lane % 16, a_chunk = lane / 16;
  const int k_row = lane % 8 + (lane / 16) * 8, k_chunk = (lane / 8) % 2;
  const int v_row = lane % 8 + ((lane / 8) % 2) * 8, v_chunk = lane / 16;

  for (int tile = 0; tile < num_tiles; ++tile) {
    // Groups committed so far: kStages<kHeadDim> - 1 + tile; allowing kStages<kHeadDim> - 2 pending means tile's group has landed.
    cp_async_wait<kStages<kHeadDim> - 2>();
    __syncthreads();  // tile's K/V (and Q) visible to all warps; the stage read in the previous tile is free
    const int next = tile + kStages<kHeadDim> - 1;
    if (next < num_tiles) load_kv(next, next % kStages<kHeadDim>);
    cp_async_commit();

    if constexpr (kConvert) {
      // Widen the landed fp8 tile into the 16-bit K and V tiles (every warp is past the previous tile's reads of
      // them: the barrier above), and a bf16 Q tile to f16 in place before its first use.
      const unsigned char* k8 = ring8 + (tile % kStages<kHeadDim>) * 2 * kTileElems;
#pragma unroll
      for (int j = 0; j < kBlockN * kChunks8 / kThreads; ++j) {
        const int i = tid + j * kThreads;
        const int r = i / kChunks8, c = i % kChunks8;
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // K, then V
          const uint4 v = *reinterpret_cast<const uint4*>(k8 + half * kTileElems + r * kHeadDim + c * 16);
          M* dst = half == 0 ? k_smem : v_smem;
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
          uint32_t wide[8];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[w] & 0xffffu), __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[w] >> 16), __NV_E4M3);
            wide[2 * w] = uint32_t(lo.x) | (uint32_t(lo.y) << 16);
            wide[2 * w + 1] = uint32_t(hi.x) | (uint32_t(hi.y) << 16);
          }
          *reinterpret_cast<uint4*>(dst + swizzle<kHeadDim>(r, 2 * c)) = make_uint4(wide[0], wide[1], wide[2], wide[3]);
          *reinterpret_cast<uint4*>(dst + swizzle<kHeadDim>(r, 2 * c + 1)) =
              make_uint4(wide[4], wide[5], wide[6], wide[7]);
        }
      }
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (tile == 0) {
          for (int i = tid; i < kBlockM * kHeadDim / 2; i += kThreads) {
            uint32_t& word = reinterpret_cast<uint32_t*>(q_smem)[i];
            const float lo = __uint_as_float(word << 16), hi = __uint_as_float(word & 0xffff0000u);
            const __half2 h = __floats2half2_rn(lo, hi);
            word = *reinterpret_cast<const uint32_t*>(&h);
          }
        }
      }
      __syncthreads();  // the 16-bit tiles (and Q) are complete for every warp's ldmatrix
    }
    const M* ks = k_smem + (kConvert ? 0 : tile % kStages<kHeadDim>) * kTileElems;
    const M* vs = v_smem + (kConvert ? 0 : tile % kStages<kHeadDim>) * kTileElems;

    // S = Q K^T: 16 rows x 64 keys per warp, as 8 n-tiles of 8 keys.
    float s[kBlockN / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(q_smem + swizzle<kHeadDim>(a_row, 2 * kk + a_chunk)));
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t b[4];  // {keys 0-7: d lo, d hi}, {keys 8-15: d lo, d hi} of this 16-key pair
        ldmatrix_x4(b, smem_addr(ks + swizzle<kHeadDim>(np * 16 + k_row, 2 * kk + k_chunk)));
        mma_16816<M>(s[2 * np], a, b[0], b[1]);
        mma_16816<M>(s[2 * np + 1], a, b[2], b[3]);
      }
    }

    if (soft_cap) soft_cap_scores<kBlockN / 2>(&s[0][0], p.feat);
    const int n0 = key_begin + tile * kBlockN;
    // The tile crosses the causal diagonal or the window's lower edge of some row.
    if (n0 + kBlockN > unmasked_end || n0 < window_full) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + n * 8 + 2 * t4 + (e & 1);
          if (key > row_last_key[e / 2] || key < row_first_key[e / 2]) s[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax: rescale the running state to the new row maximum, exponentiate the tile.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max * score_scale);
      // A row with no visible key yet keeps max -inf; subtracting 0 then keeps every exponent at exp2(-inf) = 0.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
        s[n][2 * r] = exp2f(fmaf(s[n][2 * r], score_scale, -base));
        s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], score_scale, -base));
        tile_sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + tile_sum;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }

    // O += P V: the S accumulators of key n-tiles 2kk and 2kk+1 are exactly the A fragment of keys 16kk..16kk+15.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<M>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<M>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<M>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];  // {d 0-7: keys lo, keys hi}, {d 8-15: keys lo, keys hi} of this 16-wide d pair
        ldmatrix_x4_trans(b, smem_addr(vs + swizzle<kHeadDim>(kk * 16 + v_row, 2 * dp + v_chunk)));
        mma_16816<M>(o[2 * dp], a, b[0], b[1]);
        mma_16816<M>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }

  // Every copy has landed and every warp is done with Q before the Q tile is reused to stage the output.
  cp_async_wait<0>();
  __syncthreads();

  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int m = m0 + warp * 16 + g + 8 * r;
    sum += sink_term(p.feat, kv_head * group + m % group, row_max[r]);
    inv_sum[r] = sum > 0.f ? p.feat.v_scale / sum : 0.f;
  }
  // Stage this warp's 16 normalised rows in its own Q rows (as T), then write 16-byte chunks.
  T* o_smem = reinterpret_cast<T*>(smem);
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r;
      *reinterpret_cast<uint32_t*>(o_smem + swizzle<kHeadDim>(row, n) + 2 * t4) =
          pack2<T>(o[n][2 * r] * inv_sum[r], o[n][2 * r + 1] * inv_sum[r]);
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int j = 0; j < 16 * kChunks / 32; ++j) {
    const int i = lane + j * 32;
    const int row = warp * 16 + i / kChunks, c = i % kChunks;
    const int m = m0 + row;
    if (m < num_rows) {
      const int token = q_begin + m / group;
      const int head = kv_head * group + m % group;
      *reinterpret_cast<uint4*>(out + token * p.out_stride_token + head * p.out_stride_head + c * 8) =
          *reinterpret_cast<const uint4*>(o_smem + swizzle<kHeadDim>(row, c));
    }
  }
}

}  // namespace mma_path

namespace hopper_path {

// FlashAttention forward over a paged KV cache on Hopper, causal, varlen, GQA-packed: FlashAttention-3's structure.
// Three warpgroups per block. The producer (setmaxnreg 24) has one thread copy each K/V tile page by page with TMA
// (cp.async.bulk.tensor through 4-D tensor maps over the caches: one box = one page of one kv head x 64 columns, the
// 128-byte swizzle wgmma wants done by the copy engine) into a kStages ring, completing a "full" mbarrier in bytes;
// consumer warps hand stages back on an "empty" mbarrier. At head 256 K and V have their own barriers and K runs a
// tile ahead of V (kSplitKV below). The two consumer warpgroups (setmaxnreg 240) own 64 query
// rows each of a 128-row tile and never issue a load: per K/V tile, S = Q K^T by wgmma from shared memory (swizzled
// descriptors, wgmma.cuh), online softmax in the exp2 domain (running max / sum per row, 4 lanes per row), then
// O += P V by wgmma with P re-packed from the S accumulators as the register A operand and V read transposed. P V
// runs one tile behind S (intra-warpgroup overlap: the exponentials of tile t overlap P_{t-1} V_{t-1}), and the
// warpgroups take turns issuing their wgmma (ping-pong on named barriers), so one's softmax overlaps the other's
// matrix work. The grid is persistent (one block per SM walking the work items in a snake order, heaviest causal
// tiles first): the producer streams the next item's K/V and the consumers prefetch its Q while the current item
// finishes, and the output goes straight from the accumulators to global memory.
// Needs pages of 8..128 keys dividing kBlockN (tensor-map boxes), 16-byte-aligned caches and strides; the launcher
// falls back to the mma.sync kernel otherwise.
//
// Measured on the H200 (causal, 32/8 heads, d128, one sequence, bench/results/h200/): 507 TFLOP/s at 8k tokens, 524
// at 16k (the cp.async-fed wgmma kernel this replaced: 309 / 319; ncu: tensor pipe 54% -> most consumer stalls are
// now waits on wgmma). Heads 192 and 256 (64-key tiles), on an H100 (bench/results/h100/attention-heads-fp8/): 536
// TFLOP/s at 8k for DeepSeek-V2-Lite's 16 heads of 192, 344 for Gemma-3's 16/8 heads of 256 (the mma.sync kernel:
// ~200). Head 256 with K and V on their own barriers, K released early and no spills (bench/results/h100/session19/
// and session20/, H100): 487 TFLOP/s at 8k. The smaller heads with one barrier pair per stage and Q's copies
// unrolled (session20/call3, H100): head 128 534 TFLOP/s at 8k, 549 at 16k (session 18's kernel in the same run:
// 527 / 548); keys 192 / values 128 (DeepSeek's MLA prefill) 514 on useful FLOPs at 8k, 458 at 2 x 4k.
// NOTE: where the next gains are (measure first):
//  - Short sequences (1k tokens: 249 TFLOP/s) are bounded by the per-item prologue and the causal tail; a tile
//    scheduler that splits heavy items, or 64-row tiles for them, would help the engine's many-sequence prefills.
//  - The softmax issues 66 MUFU.EX2 per thread per tile; emulating part of the exponentials with FMA polynomials
//    (FlashAttention-4's trick) would shorten it when the tensor core waits on it.
//  - Q by TMA (a 3-D map over the packed GQA rows) would free the consumers from its cp.async.
constexpr int kConsumerThreads = 256;  // warps 0-7: two warpgroups
constexpr int kProducerThreads = 128;  // warps 8-11: the producer warpgroup (one thread issues)
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kBlockM = 128;
// Keys per K/V tile and K/V tiles in flight. Heads 64 and 128: 128-key tiles, three stages (head 128: Q 32 KiB + 3 x
// 64 KiB). Heads 192 (DeepSeek MLA's decompressed prefill, V zero-padded to 192) and 256: 64-key tiles, S 64 x 64 per
// warpgroup; head 192 three stages (Q 48 KiB + 3 x 48 KiB = 192 KiB; two 128-key stages would need 240), head 256 two
// (Q 64 KiB + 2 x 64 KiB = 192 KiB; one 128-key tile of K and V alone would be 128 KiB). O is 64 x head_size per
// warpgroup: 96 or 128 accumulators per consumer thread.
template <int kHeadDim>
constexpr int kBlockN = kHeadDim >= 192 ? 64 : 128;
// The one pair of key / value widths that differ on this kernel: DeepSeek's MLA prefill.
constexpr int kNarrowKeyDim = 192, kNarrowValueDim = 128;
template <int kHeadDim>
constexpr int kStages = kHeadDim == 256 ? 2 : 3;
// Head 256 (two stages) splits each stage's K and V: each has its own full / empty barriers, K_t goes back to the
// producer once S_t is done and the producer issues K_t then V_{t-1} (P V lags S by a tile), so K_{t+2} and V_{t+1}
// are in flight a whole tile before they are read: with that and its spills gone it ran 1.41-1.52x faster on an H100.
// The smaller heads (three stages) keep one barrier pair per stage, K_t and V_t issued together and given back
// together after P_t V_t: split, head 128 ran at 0.86-0.91x of that (bench/results/h100/session19, session20), also
// with K released with V and K_t, V_t issued together on their own barriers.
template <int kHeadDim>
constexpr bool kSplitKV = kHeadDim == 256;
// fp8 e4m3 pages (heads 64 and 128): the producer's TMA copies land as dense byte rows, and the producer warpgroup's
// other three warps widen each landed tile to f16 (exact) into the 16-bit stage the consumers read, whose wgmma then
// run in f16 (P too) with the Q tile rounded to f16 in place (bf16 models: exact in f16's normal range; beyond
// +-65504 a score becomes inf and the output NaN, never a silently clipped value; the mma.sync kernel's contract).
// Head 64 lands them in a ring of their own (kStages8 stages beside the three 16-bit ones). Head 128 has no room for
// one beside three 16-bit stages (Q 32 KiB + 3 x 64 KiB), so its tiles land in place, in the V half of their own
// 16-bit stage (fp8 K then fp8 V, 16 KiB each): K is widened first, then V row by row, each row's 128 fp8 bytes read
// before its f16 columns 64-127 overwrite them (columns 0-63 overwrite the fp8 K already widened). H100
// (bench/results/h100/session21/, call 3, one binary): head 128 367-425 TFLOP/s at 4k-16k, 1.93-2.07x the mma.sync
// kernel on the same fp8 pages and 0.77-0.78x the 16-bit pages; head 64 295-335, 1.6-1.75x (0.82-0.86x of 16-bit).
// Two 16-bit stages beside a two-stage fp8 ring at head 128 ran at 0.59-0.62x of the 16-bit pages (call 2).
// NOTE: the remaining 22% at head 128 is, measure first, the converters (96 threads, 24 registers, one 16-byte chunk
// per step; the copy of tile t+3 cannot start before the stage is given back, and its widening follows) or their
// shared-memory traffic (1.5x the tile's bytes on top of the wgmma reads).
template <int kHeadDim>
constexpr bool kFp8InPlace = kHeadDim == 128;
// Head 64 under a sliding window of at most kWindowTileMaxWindow keys: one 160-key tile per item. A 128-row item is
// 128 / group tokens (16 at gpt-oss's 8 query heads per kv head), whose keys span window + 15 + the page slack:
// 143-158 keys at a 128-token window, two 128-key tiles (2x the useful work) or one 160-key tile (1.25x).
// Measured on an H100 (bench/results/h100/session22/call1/): gpt-oss window-128 prefill 1.18-1.23x faster at 1k-16k
// tokens (8k: 181.6 against 219.5 us), fp8 pages 1.20x; full attention runs the 128-key kernel as before.
constexpr int kWindowBlockN = 160;
constexpr int64_t kWindowTileMaxWindow = 144;
template <int kHeadDim>
constexpr int kStages8 = kFp8InPlace<kHeadDim> ? kStages<kHeadDim> : 3;
constexpr int kBarConverters = 6;  // named barrier of the three converter warps
constexpr int kConverterWarps = 3;  // warps 9-11: the producer warpgroup's warps that do not issue copies

// Device-only pieces, in the Hopper device pass alone (the sm_80 pass compiles the kernel as a trap).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Named barriers (0 is __syncthreads): both consumer warpgroups after zeroing V rows; each warpgroup's Q landed
// (2 + wg); each warpgroup's turn to issue wgmma (4 + wg).
constexpr int kBarVZeroed = 1, kBarWarpGroup0 = 2, kBarTurn0 = 4;
// 24 + 2 x 240 = 3 x 168. The fp8 converters fit in 24 with their loop not unrolled (40 + 2 x 232 spilled more).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Four e4m3 values (one 32-bit word) as two f16x2 words (exact: every e4m3 value is an f16 normal or zero). The
// decode kernel's e4m3x4_to_f16x4 (the same cvt in inline PTX on the word's 16-bit halves) cost the 24-register
// converter warps 8 more bytes of spills here.
__device__ __forceinline__ void widen_e4m3x4(uint32_t word, uint32_t& lo, uint32_t& hi) {
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word & 0xffffu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> 16), __NV_E4M3);
  lo = uint32_t(a.x) | (uint32_t(a.y) << 16);
  hi = uint32_t(b.x) | (uint32_t(b.y) << 16);
}

// exp2 without the subnormal handling of exp2f (results below 2^-126 flush to 0: a probability that small is 0 here).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One unit of work: a kBlockM-row query tile of one kv head of one sequence, and the keys it sees.
struct Work {
  int kv_head, seq, m0, q_begin, q_len, num_rows;
  int offset;        // query token j of the sequence sits at key position offset + j
  int key_end;       // keys [0, key_end) are visible to some row of the tile
  int unmasked_end;  // keys [0, unmasked_end) are visible to every row
  // A sliding window narrows the keys to [key_begin, key_end); keys at or past window_full are inside every row's
  // window. Without one: key_begin 0, window_full INT_MIN.
  int key_begin, window_full;
  int key_base;   // the first tile's first key: key_begin rounded down to its page (pages before it are never read)
  int num_tiles;  // K/V tiles of kBlockN keys from key_base covering [key_begin, key_end)
};
// Work item `item` of the launch, in (kv head fastest, sequence, query tile last: the tiles of every sequence with the
// longest causal span come first) order; false when the tile lies past its sequence's rows (varlen batches).
template <int kN>
__device__ __forceinline__ bool load_work(const PrefillParams& p, int item, int num_kv_heads, int num_seqs,
                                          int m_tiles, Work& w) {
  w.kv_head = item % num_kv_heads;
  const int r = item / num_kv_heads;
  w.seq = r % num_seqs;
  w.m0 = (m_tiles - 1 - r / num_seqs) * kBlockM;
  w.q_begin = p.query_start_loc[w.seq];
  w.q_len = p.query_start_loc[w.seq + 1] - w.q_begin;
  w.num_rows = w.q_len * p.group_size;
  if (w.m0 >= w.num_rows) return false;
  w.offset = p.seq_lens[w.seq] - w.q_len;
  const int first_token = w.m0 / p.group_size;
  const int last_token = min((w.m0 + kBlockM - 1) / p.group_size, w.q_len - 1);
  w.key_end = last_token + w.offset + 1;
  w.unmasked_end = first_token + w.offset + 1;
  w.key_begin = max(window_first_key(p.feat, first_token + w.offset), 0);
  w.window_full = window_first_key(p.feat, last_token + w.offset);
  w.key_base = w.key_begin / p.block_size * p.block_size;
  w.num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_base, kN) : 0;
  return true;
}

// The k-th item of block b among g blocks: rounds of g items, every other round reversed, so that the heavy early
// items of a round and the light late ones pair up (causal tiles come heaviest first).
__device__ __forceinline__ int snake_item(int k, int b, int g) { return k * g + ((k & 1) ? g - 1 - b : b); }

#endif  // __CUDA_ARCH__ >= 900

// grid = min(work items, one block per SM); block = kThreads; dynamic smem = Q tile + kStages K/V tiles (+ kStages8
// fp8 K/V tiles) + 4 kStages mbarriers + 1024 bytes of alignment slack. Block b takes the items
// snake_item(k, b, gridDim.x), k = 0, 1, ...
// KV: the pages' type (T, or __nv_fp8_e4m3 at heads 64 and 128). kHeadDimV: the values' width (DeepSeek's MLA
// prefill: keys 192, values 128; else kHeadDim).
// kN: keys per K/V tile (kBlockN, or kWindowBlockN for head 64 under a short sliding window).
template <class T, class KV, int kHeadDim, int kHeadDimV, int kN = kBlockN<kHeadDim>>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attn_prefill_tma_kernel(PrefillParams p, const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap v_map, int num_items, int num_kv_heads,
                                  int num_seqs, int m_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_attn_prefill: wgmma needs Hopper's arch-specific target: KBN_CUDA_GENCODE -gencode=arch=compute_90a,code=sm_90a, not compute_90"
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kFp8 = !std::is_same_v<KV, T>;
  static_assert(!kFp8 || (std::is_same_v<KV, __nv_fp8_e4m3> && kHeadDimV == kHeadDim && kHeadDim <= 128),
                "16-bit pages of q's type, or fp8 e4m3 pages at heads 64 and 128");
  using M = std::conditional_t<kFp8, __half, T>;  // the wgmma's input type
  static_assert(kN == kBlockN<kHeadDim> || (kHeadDim == 64 && kN == 160), "the tile widths wgmma is instantiated for");
  constexpr int kSt = kStages<kHeadDim>;
  constexpr bool kInPlace = kFp8 && kFp8InPlace<kHeadDim>;  // fp8 tiles land in their 16-bit stage's V half
  constexpr bool kRing8 = kFp8 && !kInPlace;                // fp8 tiles land in a ring of their own
  constexpr int kSt8 = kStages8<kHeadDim>;  // fp8 pages only: landing slots (kInPlace: the 16-bit stages)
  constexpr int kChunks = kHeadDim / 8;
  constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
  constexpr uint32_t kTileBytes = kN * kHeadDim * 2;            // a K tile
  constexpr uint32_t kVTileBytes = kN * kHeadDimV * 2;          // a V tile
  constexpr uint32_t kStageBytes = kTileBytes + kVTileBytes;  // [K tile, V tile]
  constexpr uint32_t kStage8Bytes = kN * (kHeadDim + kHeadDimV);  // fp8 pages: [K tile, V tile] of dense byte rows
  constexpr int kSAcc = kN / 2;
  constexpr int kOAcc = kHeadDimV / 2;
  static_assert(kHeadDimV == kHeadDim || (kHeadDim == kNarrowKeyDim && kHeadDimV == kNarrowValueDim),
                "values as wide as keys, or 192 / 128");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "wgmma shapes for head sizes 64, 128, 192, 256");

  extern __shared__ unsigned char smem_raw[];
  // The swizzle atoms must start 1024-byte aligned; the launcher adds 1024 bytes of slack.
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t q_s = (raw_addr + 1023u) & ~1023u;
  const uint32_t kv_s = q_s + kQBytes;                        // [kStages][K tile, V tile]
  const uint32_t ring8 = kv_s + kSt * kStageBytes;            // fp8 pages: [kStages8][K tile, V tile]
  // K and V have their own barriers (K_t is released once S_t is done, V_t once P_t V_t is): [K, V][kStages] each.
  // fp8 pages: [16-bit stages (widened), fp8 landing slots (landed)] instead (kSt8 <= kSt).
  const uint32_t full_bar = ring8 + (kRing8 ? kSt8 * kStage8Bytes : 0);  // 8 bytes each
  const uint32_t empty_bar = full_bar + 2 * kSt * 8;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < 2 * kSt; ++st) {
      // The producer's arrive.expect_tx, the TMA copies completing the bytes; a 16-bit stage of fp8 pages: lane 0
      // of every converter warp once it has written its share.
      mbar_init(full_bar + 8 * st, kFp8 && st < kSt ? kConverterWarps : 1);
      // Lane 0 of every consumer warp, once it is done; an fp8 stage: of every converter warp.
      mbar_init(empty_bar + 8 * st, kRing8 && st >= kSt ? kConverterWarps : kConsumerThreads / 32);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (tid >= kConsumerThreads) {
    // ---- producer warpgroup: one thread issues every copy, through a ring that runs on across work items ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters) : "memory");
    if (tid == kConsumerThreads) {
      const int bs = p.block_size;
      // Tile `tile` of the ring (counted over the block's items), pages [0, pages) into its stage: K (part 0) or V
      // (part 1) on their own barriers, or both on K's (part 2: one barrier pair per stage).
      auto issue = [&](int tile, int part, const int* block_table, int kv_head, int n0, int pages) {
        const int stage = tile % kSt;
        const int b = (part == 1 ? kSt : 0) + stage;
        if (tile >= kSt) mbar_wait(empty_bar + 8 * b, uint32_t((tile / kSt - 1) & 1));
        const uint32_t bar = full_bar + 8 * b;
        const int width = (part != 1 ? kHeadDim : 0) + (part != 0 ? kHeadDimV : 0);
        mbar_arrive_expect_tx(bar, uint32_t(pages * bs * width * 2));
        const uint32_t ks = kv_s + stage * kStageBytes, vs = ks + kTileBytes;
        for (int j = 0; j < pages; ++j) {
          const int block = block_table[n0 / bs + j];
          if (part != 1) {
#pragma unroll
            for (int half = 0; half < kHeadDim / 64; ++half)
              tma_load_4d(ks + half * (kN * 128) + j * bs * 128, &k_map, bar, half * 64, kv_head, 0, block);
          }
          if (part != 0) {
#pragma unroll
            for (int half = 0; half < kHeadDimV / 64; ++half)
              tma_load_4d(vs + half * (kN * 128) + j * bs * 128, &v_map, bar, half * 64, kv_head, 0, block);
          }
        }
      };
      // fp8 pages: tile `tile`, pages [0, pages), K and V into its landing slot on one barrier, once the slot is
      // free (kInPlace: its 16-bit stage, given back by the consumers; else the converters' fp8 ring).
      auto issue8 = [&](int tile, const int* block_table, int kv_head, int n0, int pages) {
        const int s8 = tile % kSt8;
        if (tile >= kSt8) mbar_wait(empty_bar + 8 * (kInPlace ? s8 : kSt + s8), uint32_t((tile / kSt8 - 1) & 1));
        const uint32_t bar = full_bar + 8 * (kSt + s8);
        mbar_arrive_expect_tx(bar, uint32_t(pages * bs * (kHeadDim + kHeadDimV)));
        const uint32_t k8 = kInPlace ? kv_s + s8 * kStageBytes + kTileBytes : ring8 + s8 * kStage8Bytes;
        const uint32_t v8 = k8 + kN * kHeadDim;
        for (int j = 0; j < pages; ++j) {
          const int block = block_table[n0 / bs + j];
          tma_load_4d(k8 + j * bs * kHeadDim, &k_map, bar, 0, kv_head, 0, block);
          tma_load_4d(v8 + j * bs * kHeadDimV, &v_map, bar, 0, kv_head, 0, block);
        }
      };
      int it = 0;  // K tiles issued by this block so far
      const int* prev_table = nullptr;
      int prev_head = 0, prev_n0 = 0, prev_pages = 0;
      for (int k = 0; k * int(gridDim.x) < num_items; ++k) {
        const int item = snake_item(k, blockIdx.x, gridDim.x);
        Work w;
        if (item >= num_items || !load_work<kN>(p, item, num_kv_heads, num_seqs, m_tiles, w)) continue;
        const int* block_table = p.block_tables + int64_t(w.seq) * p.block_table_stride;
        for (int tile = 0; tile < w.num_tiles; ++tile, ++it) {
          const int n0 = w.key_base + tile * kN;
          const int pages = (min(w.key_end - n0, kN) + bs - 1) / bs;  // pages holding keys below key_end
          if constexpr (kFp8) {
            issue8(it, block_table, w.kv_head, n0, pages);
          } else if constexpr (kSplitKV<kHeadDim>) {  // K_t, then V_{t-1}: the order the consumers read them in
            issue(it, 0, block_table, w.kv_head, n0, pages);
            if (it > 0) issue(it - 1, 1, prev_table, prev_head, prev_n0, prev_pages);
          } else {
            issue(it, 2, block_table, w.kv_head, n0, pages);
          }
          prev_table = block_table, prev_head = w.kv_head, prev_n0 = n0, prev_pages = pages;
        }
      }
      if (kSplitKV<kHeadDim> && it > 0) issue(it - 1, 1, prev_table, prev_head, prev_n0, prev_pages);
    } else if constexpr (kFp8) {
      if (tid < kConsumerThreads + 32) return;  // the issuing warp's other lanes
      // Converter warps: walk the same tiles, widening each landed fp8 tile (whole rows: rows past the copied
      // pages hold earlier bytes, masked or zeroed downstream like the 16-bit path's) into its 16-bit stage once
      // the consumers have given that back. Each warp takes 32 consecutive 16-byte chunks (whole rows) at a time.
      const int cwarp = (tid - kConsumerThreads) / 32 - 1;
      constexpr int kRowChunks = kHeadDim / 16;   // 16-byte chunks of one fp8 row
      constexpr int kPartChunks = kN * kRowChunks;  // of a K (or V) tile
      static_assert(kPartChunks % 32 == 0 && 32 % kRowChunks == 0, "whole rows per warp step");
      // Widen chunks [base, base + 32) of part `part` (0: K, 1: V) of the landed tile at src into the stage at dst.
      // Shared addresses as 32-bit integers (generic pointers cost the 24-register warps spills).
      auto widen_part = [&](uint32_t src, uint32_t dst, int part) {
#pragma unroll 1
        for (int base = cwarp * 32; base < kPartChunks; base += kConverterWarps * 32) {
          const int i = base + lane, r = i / kRowChunks, c = i % kRowChunks;
          const uint4 v = ld_shared_v4(src + part * kPartChunks * 16 + i * 16);
          // In place, row r's f16 columns 64-127 overwrite its fp8 V bytes: the warp's whole rows are read first.
          if (kInPlace && part == 1) __syncwarp();
          uint4 a, b;
          widen_e4m3x4(v.x, a.x, a.y);
          widen_e4m3x4(v.y, a.z, a.w);
          widen_e4m3x4(v.z, b.x, b.y);
          widen_e4m3x4(v.w, b.z, b.w);
          const uint32_t d = dst + part * kTileBytes;
          st_shared_v4(d + sw128_offset<kN>(r, 2 * c), a);
          st_shared_v4(d + sw128_offset<kN>(r, 2 * c + 1), b);
        }
      };
      int it = 0;
      for (int k = 0; k * int(gridDim.x) < num_items; ++k) {
        const int item = snake_item(k, blockIdx.x, gridDim.x);
        Work w;
        if (item >= num_items || !load_work<kN>(p, item, num_kv_heads, num_seqs, m_tiles, w)) continue;
        for (int tile = 0; tile < w.num_tiles; ++tile, ++it) {
          const int s8 = it % kSt8, stage = it % kSt;
          mbar_wait(full_bar + 8 * (kSt + s8), uint32_t((it / kSt8) & 1));  // landed
          // The 16-bit stage is free (in place: the producer waited for it before the copy).
          if (!kInPlace && it >= kSt) mbar_wait(empty_bar + 8 * stage, uint32_t((it / kSt - 1) & 1));
          const uint32_t dst = kv_s + stage * kStageBytes;
          const uint32_t src = kInPlace ? dst + kTileBytes : ring8 + s8 * kStage8Bytes;
          widen_part(src, dst, 0);
          // In place, V's f16 columns 0-63 overwrite the fp8 K: every converter warp is past its reads first.
          if constexpr (kInPlace) named_sync(kBarConverters, kConverterWarps * 32);
          widen_part(src, dst, 1);
          fence_proxy_async_shared();  // the generic-proxy writes, before the consumers' wgmma read them
          __syncwarp();
          if (lane == 0) {
            mbar_arrive(full_bar + 8 * stage);
            if constexpr (kRing8) mbar_arrive(empty_bar + 8 * (kSt + s8));
          }
        }
      }
    }
    return;
  }

  // ---- consumers: warpgroup wg owns rows 64 wg .. 64 wg + 63 of every query tile ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters) : "memory");
  const int wg = tid / 128;
  const int wg_tid = tid % 128;
  const int warp_in_wg = wg_tid / 32;
  const int g = lane / 4, t4 = lane % 4;  // this thread's rows of the warp: g and g + 8
  const int warp_row = wg * 64 + warp_in_wg * 16;
  const uint32_t q_wg = q_s + wg * 64 * 128;  // this warpgroup's 64 rows in each 64-column block of Q
  const bool soft_cap = p.feat.cap_in > 0.f;
  const float score_scale = soft_cap ? 1.f : p.scale_log2;  // soft-capped scores are in the exp2 domain already
  const T* q = static_cast<const T*>(p.q);
  T* out = static_cast<T*>(p.out);

  // This warpgroup's 64 Q rows of work w, by cp.async (rows past the sequence's last token are zero-filled). Issued
  // for the next item as soon as the last S = Q K^T of the current one has read Q, so it overlaps the last P V.
  // At head 256 not unrolled: it runs inside the last tile's step, where O, S and P hold 176 registers there, and
  // unrolled its 16 source addresses were computed up front and spilled.
  auto load_q = [&](const Work& w) {
    auto chunk = [&](int j) {
      const int i = wg_tid + j * 128;
      const int r = wg * 64 + i / kChunks, c = i % kChunks;
      const int m = w.m0 + r;
      const bool valid = m < w.num_rows;
      const T* src = q;
      if (valid) {
        const int token = w.q_begin + m / p.group_size;
        const int head = w.kv_head * p.group_size + m % p.group_size;
        src = q + token * p.q_stride_token + head * p.q_stride_head + c * 8;
      }
      cp_async_16(q_s + sw128_offset<kBlockM>(r, c), src, valid);
    };
    if constexpr (kHeadDim == 256) {
#pragma unroll 1
      for (int j = 0; j < 64 * kChunks / 128; ++j) chunk(j);
    } else {
#pragma unroll
      for (int j = 0; j < 64 * kChunks / 128; ++j) chunk(j);
    }
    cp_async_commit();
  };
  // The next item of this block with rows after its k-th, or false.
  auto next_work = [&](int& k, Work& w) {
    for (++k; k * int(gridDim.x) < num_items; ++k) {
      const int item = snake_item(k, blockIdx.x, gridDim.x);
      if (item < num_items && load_work<kN>(p, item, num_kv_heads, num_seqs, m_tiles, w)) return true;
    }
    return false;
  };

  uint32_t pa[kN / 16][4];  // P of the previous tile as A fragments: keys 16kk..16kk+15 of the tile
  float o[kOAcc];
  // O += P V of the tile whose V sits in shared address `vs` (V rows are the K of each step, head_size columns the N,
  // in 64-column blocks kBlockN * 128 bytes apart).
  auto issue_pv = [&](uint32_t vs) {
    if constexpr (kHeadDim == 256) asm volatile("" : "+r"(vs));  // see the note on descriptors in `step`
    const Sw128Desc<kN * 128, 1024> dvs(vs);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t dv = dvs.at(kk * 16 * 128);
      if constexpr (kHeadDimV == 256) {
        wgmma_rs_n256_tb<M>(o, pa[kk], dv);
      } else if constexpr (kHeadDimV == 192) {
        wgmma_rs_n192_tb<M>(o, pa[kk], dv);
      } else if constexpr (kHeadDimV == 128) {
        wgmma_rs_n128_tb<M>(o, pa[kk], dv);
      } else {
        wgmma_rs_n64_tb<M>(o, pa[kk], dv);
      }
    }
  };
  auto release = [&](int v, int stage) {  // this warp is done with K (v = 0) or V of `stage`
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar + 8 * (v * kSt + stage));
  };

  int item = -1;  // k of the current item
  Work w;
  bool have = next_work(item, w);
  if (have) load_q(w);
  int it = 0;  // K/V tiles consumed by this block so far
  // Ping-pong: a warpgroup issues its wgmma after the other one has issued its previous batch. Warpgroup 1 gives
  // warpgroup 0 the first turn and skips its very last hand-back (nobody waits for it).
  if (wg == 1 && have) named_arrive(kBarTurn0, kConsumerThreads);
  while (have) {
    cp_async_wait<0>();
    if constexpr (kFp8 && !std::is_same_v<T, __half>) {
      // fp8 pages: the wgmma run in f16, so this warpgroup's Q rows (8 KiB per 64 columns) are rounded to f16 in
      // place once every thread's copies have landed.
      named_sync(kBarWarpGroup0 + wg, 128);
#pragma unroll 1
      for (int j = 0; j < 64 * kChunks / 128; ++j) {
        const int i = wg_tid + j * 128;  // 16-byte chunk i of the warpgroup's rows, block by 64-column block
        uint4* chunk = reinterpret_cast<uint4*>(smem_raw + (q_wg - raw_addr) + (i / 512) * (kBlockM * 128) +
                                                (i % 512) * 16);
        uint4 v = *chunk;
        uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const __half2 h = __floats2half2_rn(__uint_as_float(words[e] << 16), __uint_as_float(words[e] & 0xffff0000u));
          words[e] = *reinterpret_cast<const uint32_t*>(&h);
        }
        *chunk = v;
      }
    }
    fence_proxy_async_shared();
    named_sync(kBarWarpGroup0 + wg, 128);  // this warpgroup's Q rows have landed

    int row_last_key[2], row_first_key[2];  // rows past the last token clamp to it (never stored)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int m = w.m0 + warp_row + g + 8 * r;
      row_last_key[r] = min(m / p.group_size, w.q_len - 1) + w.offset;
      row_first_key[r] = window_first_key(p.feat, row_last_key[r]);
    }
#pragma unroll
    for (int i = 0; i < kOAcc; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // exp2 domain
    float row_sum[2] = {0.f, 0.f};              // this lane's partial sums; reduced over the quad at the end

    int next_item = item;  // found now, so that its global reads are long done when its Q is fetched
    Work next;
    const bool have_next = next_work(next_item, next);
    // One K/V tile: S = Q K^T, then (kWithPv) the previous tile's P V as a second wgmma group, the online softmax of S
    // while that P V runs, and S re-packed as the A operand of this tile's P V. The first tile of an item has no P V
    // before it: a separate instantiation, so that no wgmma group is conditional.
    auto step = [&](int tile, auto with_pv) {
      constexpr bool kWithPv = decltype(with_pv)::value;
      const int stage = it % kSt;
      mbar_wait(full_bar + 8 * stage, uint32_t((it / kSt) & 1));  // K_t (and V_t, unsplit)
      if constexpr (kWithPv && kSplitKV<kHeadDim>)
        mbar_wait(full_bar + 8 * (kSt + (it - 1) % kSt), uint32_t(((it - 1) / kSt) & 1));  // V_{t-1}
      // At head 256 the tile's shared addresses pass through an empty asm: otherwise the compiler hoists the 16 Q and
      // 16 K descriptors of every stage out of the tile loop as invariants, and ptxas spilled them (with load_q's
      // addresses: 392 bytes per consumer thread; none now at any head). Smaller heads keep them hoisted: they fit,
      // and recomputing them between the turn barrier and the first wgmma cost head 128 time (measure first).
      uint32_t ks = kv_s + stage * kStageBytes;
      uint32_t qw = q_wg;
      if constexpr (kHeadDim == 256) asm volatile("" : "+r"(ks), "+r"(qw));

      // S: 64 rows x kBlockN keys per warpgroup, K = head_size in steps of 16 (32 bytes within a row of a 64-column
      // block).
      float s[kSAcc];
      named_sync(kBarTurn0 + wg, kConsumerThreads);
      const Sw128Desc<16, 1024> dq(qw), dk(ks);  // each k-step's descriptors: one add from these (Sw128Desc)
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;
        const uint64_t da = dq.at((kk / 4) * (kBlockM * 128) + col);
        const uint64_t db = dk.at((kk / 4) * (kN * 128) + col);
        if constexpr (kN == 64) {
          wgmma_ss_n64<M>(s, da, db, kk > 0 ? 1 : 0);
        } else if constexpr (kN == 160) {
          wgmma_ss_n160<M>(s, da, db, kk > 0 ? 1 : 0);
        } else {
          wgmma_ss_n128<M>(s, da, db, kk > 0 ? 1 : 0);
        }
      }
      wgmma_commit();
      if constexpr (kWithPv) {
        issue_pv(kv_s + ((it - 1) % kSt) * kStageBytes + kTileBytes);
        wgmma_commit();
      }
      if (!(wg == 1 && tile == w.num_tiles - 1 && !have_next))
        named_arrive(kBarTurn0 + 1 - wg, kConsumerThreads);
      if constexpr (kWithPv) {
        wgmma_wait<1>();  // S is ready; P V may still run
      } else {
        wgmma_wait<0>();
      }
      fence_regs(s);
      if constexpr (kSplitKV<kHeadDim>) release(0, stage);  // K_t is read
      // Q is read for this item: fetch the next item's rows behind the softmax and the last P V.
      if (tile == w.num_tiles - 1 && have_next) load_q(next);

      if (soft_cap) soft_cap_scores<kSAcc>(s, p.feat);
      const int n0 = w.key_base + tile * kN;
      // The tile crosses the causal diagonal or the window's lower edge of some row.
      if (n0 + kN > w.unmasked_end || n0 < w.window_full) {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + n * 8 + 2 * t4 + (e & 1);
            if (key > row_last_key[e / 2] || key < row_first_key[e / 2]) s[4 * n + e] = -INFINITY;
          }
        }
      }

      // Online softmax: the new row maximum, the tile exponentiated against it.
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Four independent partial maxima and sums: a serial chain of dependent adds is latency the schedulers
        // cannot hide with two math warps per scheduler.
        float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kN / 8; ++n)
          part[n % 4] = fmaxf(part[n % 4], fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
        float tile_max = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[r], tile_max * score_scale);
        // A row with no visible key yet keeps max -inf; subtracting 0 then keeps every exponent at exp2(-inf) = 0.
        const float base = new_max == -INFINITY ? 0.f : new_max;
        alpha[r] = exp2_ftz(row_max[r] - base);
        row_max[r] = new_max;
        float sums[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
          s[4 * n + 2 * r] = exp2_ftz(fmaf(s[4 * n + 2 * r], score_scale, -base));
          s[4 * n + 2 * r + 1] = exp2_ftz(fmaf(s[4 * n + 2 * r + 1], score_scale, -base));
          sums[n % 4] += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
        }
        row_sum[r] = row_sum[r] * alpha[r] + ((sums[0] + sums[1]) + (sums[2] + sums[3]));
      }

      if constexpr (kWithPv) {
        // The previous P V is done: its stage goes back to the producer, O and the P registers are free. Rescale O
        // to the new maximum, unless no row of the warp has a new one (alpha is exactly 1 then: common once the
        // maxima settle).
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
        release(kSplitKV<kHeadDim> ? 1 : 0, (it - 1) % kSt);  // V_{t-1} (and K_{t-1} with it, unsplit)
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
          for (int n = 0; n < kHeadDimV / 8; ++n) {
            o[4 * n + 0] *= alpha[0];
            o[4 * n + 1] *= alpha[0];
            o[4 * n + 2] *= alpha[1];
            o[4 * n + 3] *= alpha[1];
          }
        }
      }
      // S accumulators of key n-tiles 2kk and 2kk+1 are exactly the A fragment of keys 16kk..16kk+15.
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        pa[kk][0] = pack2<M>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<M>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<M>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<M>(s[8 * kk + 6], s[8 * kk + 7]);
      }
      ++it;
    };
    if (w.num_tiles > 0) step(0, std::false_type{});
    for (int tile = 1; tile < w.num_tiles; ++tile) step(tile, std::true_type{});
    if (w.num_tiles > 0) {  // the last tile's P V
      const int last = (it - 1) % kSt;
      const uint32_t vs = kv_s + last * kStageBytes + kTileBytes;
      if constexpr (kSplitKV<kHeadDim>) mbar_wait(full_bar + 8 * (kSt + last), uint32_t(((it - 1) / kSt) & 1));
      // Rows of the last tile at or past key_end hold what the cache holds beyond the sequence (whole pages are
      // copied) or an earlier tile's keys (pages not copied): their probabilities are 0, but 0 x NaN is NaN. Both
      // warpgroups read every V row, so they zero the rows together and meet before the multiply.
      const int n_last = w.key_base + (w.num_tiles - 1) * kN;
      if (w.key_end - n_last < kN) {
        unsigned char* vz = smem_raw + (vs - raw_addr);
        const int first = w.key_end - n_last;
        constexpr int kVChunks = kHeadDimV / 8;
        for (int i = tid; i < (kN - first) * kVChunks; i += kConsumerThreads) {
          const int r = first + i / kVChunks, c = i % kVChunks;
          *reinterpret_cast<uint4*>(vz + sw128_offset<kN>(r, c)) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async_shared();
        named_sync(kBarVZeroed, kConsumerThreads);
      }
      wgmma_fence();
      issue_pv(vs);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(kSplitKV<kHeadDim> ? 1 : 0, last);
    } else if (have_next) {  // no visible key (seq_lens below the query length): O stays 0
      load_q(next);
    }

    // Normalise, then store 16 bytes per lane: a quad holds a row's chunks of 8 columns as four 4-byte words each
    // (lane t4: columns 8n + 2 t4, + 1); a 4x4 transpose of those words inside the quad (two shuffle rounds) gives lane
    // t4 all of chunk 4k + t4, one 16-byte store where the direct route took four 4-byte stores into half-filled
    // 32-byte sectors (ncu, gpt-oss window-128 prefill: a fifth of the samples waited on those stores). `out` is the
    // op's own contiguous tensor, so every 8-column chunk is 16-byte aligned.
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int m = w.m0 + warp_row + g + 8 * r;
      sum += sink_term(p.feat, w.kv_head * p.group_size + m % p.group_size, row_max[r]);
      inv_sum[r] = sum > 0.f ? p.feat.v_scale / sum : 0.f;
    }
    static_assert(kHeadDimV % 32 == 0, "the quad transpose takes chunks of 8 columns four at a time");
    const bool hi2 = t4 & 2, hi1 = t4 & 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int m = w.m0 + warp_row + g + 8 * r;
      T* dst = nullptr;
      if (m < w.num_rows) {
        const int token = w.q_begin + m / p.group_size;
        const int head = w.kv_head * p.group_size + m % p.group_size;
        dst = out + token * p.out_stride_token + head * p.out_stride_head + 8 * t4;
      }
#pragma unroll
      for (int k = 0; k < kHeadDimV / 32; ++k) {
        uint32_t a[4];
#pragma unroll
        for (int c = 0; c < 4; ++c)
          a[c] = pack2<T>(o[4 * (4 * k + c) + 2 * r] * inv_sum[r], o[4 * (4 * k + c) + 2 * r + 1] * inv_sum[r]);
        // Round 1, with lane t4 ^ 2: keep the chunk pair of this lane's half (2 hi2, 2 hi2 + 1), send the other.
        const uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi2 ? a[0] : a[2], 2);
        const uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi2 ? a[1] : a[3], 2);
        const uint32_t own0 = hi2 ? a[2] : a[0], own1 = hi2 ? a[3] : a[1];
        // Round 2, with lane t4 ^ 1: keep chunk t4 (own word and lane t4 ^ 2's), send the pair's other chunk.
        const uint32_t keep_own = hi1 ? own1 : own0, keep_far = hi1 ? r1 : r0;
        const uint32_t got_own = __shfl_xor_sync(0xffffffffu, hi1 ? own0 : own1, 1);  // lane t4 ^ 1's word
        const uint32_t got_far = __shfl_xor_sync(0xffffffffu, hi1 ? r0 : r1, 1);      // lane t4 ^ 3's word
        // Word j of chunk t4 comes from lane j.
        uint32_t v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          v[j] = j == t4 ? keep_own : j == (t4 ^ 2) ? keep_far : j == (t4 ^ 1) ? got_own : got_far;
        if (dst) *reinterpret_cast<uint4*>(dst + 32 * k) = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
    item = next_item;
    w = next;
    have = have_next;
  }
#else
  __trap();  // not launched: the host picks this kernel only when the binary holds sm_90a code for the device
#endif
}

// A tensor map over one cache [num_blocks, block_size, num_kv_heads, head_size] (strides in elements) whose box is
// one page of one kv head and 64 columns, 128-byte swizzled (16-bit pages), or one page of whole dense rows (fp8
// pages: bytes, no swizzle); false when the layout does not allow one.
inline bool encode_cache_map(CUtensorMap& map, const void* base, DType dt, int64_t num_blocks, int64_t block_size,
                             int64_t kv_heads, int64_t head_size, int64_t stride_block, int64_t stride_slot,
                             int64_t stride_head) {
  const EncodeTiled fn = encode_tiled();
  if (!fn) return false;
  const bool fp8 = dt == DType::fp8e4m3;
  const int64_t es = fp8 ? 1 : 2;
  for (int64_t s : {stride_block, stride_slot, stride_head})
    if (s * es % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  const cuuint64_t dims[4] = {cuuint64_t(head_size), cuuint64_t(kv_heads), cuuint64_t(block_size),
                              cuuint64_t(num_blocks)};
  const cuuint64_t strides[3] = {cuuint64_t(stride_head * es), cuuint64_t(stride_slot * es),
                                 cuuint64_t(stride_block * es)};
  if (fp8 && (head_size % 16 != 0 || head_size > 256)) return false;
  const cuuint32_t box[4] = {fp8 ? cuuint32_t(head_size) : 64u, 1, cuuint32_t(block_size), 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = fp8                  ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : dt == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(&map, type, 4, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
            fp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace hopper_path

// Hopper's TMA/wgmma kernel on 16-bit pages (or fp8 pages at heads 64 and 128), when this binary holds sm_90a code
// for the device (runs_sm90_image) and the caches allow its tensor maps (pages of 8..kBlockN keys dividing kBlockN,
// 16-byte strides); false, launching nothing, otherwise. kHeadDimV: the values' width.
template <class T, class KV, int kHeadDim, int kHeadDimV, int kN = hopper_path::kBlockN<kHeadDim>>
bool launch_hopper_prefill(const PrefillParams& p, int64_t num_seqs, int64_t num_kv_heads, int64_t max_query_len,
                           int64_t num_blocks, int device, Stream stream) {
  using namespace hopper_path;
  constexpr bool kFp8 = !std::is_same_v<KV, T>;
  auto* hopper = flash_attn_prefill_tma_kernel<T, KV, kHeadDim, kHeadDimV, kN>;
  if (!runs_sm90_image(reinterpret_cast<const void*>(hopper), device)) return false;
  const int bs = p.block_size;
  const DType dt = kFp8 ? DType::fp8e4m3 : std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::f16;
  CUtensorMap k_map{}, v_map{};
  if (!(bs >= 8 && bs % 8 == 0 && kN % bs == 0 &&
        encode_cache_map(k_map, p.key_cache, dt, num_blocks, bs, num_kv_heads, kHeadDim, p.k_stride_block,
                         p.k_stride_slot, p.k_stride_head) &&
        encode_cache_map(v_map, p.value_cache, dt, num_blocks, bs, num_kv_heads, kHeadDimV, p.v_stride_block,
                         p.v_stride_slot, p.v_stride_head)))
    return false;
  // + 1024: the kernel aligns its tiles to the 1024-byte swizzle atom; + 32 per stage: its four mbarriers.
  constexpr int kSt = kStages<kHeadDim>, kSt8 = kFp8 && !kFp8InPlace<kHeadDim> ? kStages8<kHeadDim> : 0;
  const size_t smem = (size_t(kBlockM) * kHeadDim + size_t(kSt) * kN * (kHeadDim + kHeadDimV)) * 2 +
                      size_t(kSt8) * kN * (kHeadDim + kHeadDimV) + 1024 + 32 * kSt;
  const int64_t m_tiles = (max_query_len * p.group_size + kBlockM - 1) / kBlockM;
  const int64_t num_items = num_kv_heads * m_tiles * num_seqs;
  KBN_CHECK(num_items <= INT32_MAX, "flash_attn_prefill: ", num_items, " query tiles of ", kBlockM,
            " rows (max_query_len ", max_query_len, " x ", p.group_size, " query heads per kv head x ", num_kv_heads,
            " kv heads x ", num_seqs, " sequences) exceed 2^31 - 1");
  const KernelLaunchFacts& facts = kernel_launch_facts(reinterpret_cast<const void*>(hopper), device, kThreads, smem);
  const int64_t resident = int64_t(facts.num_sms) * std::max(facts.blocks_per_sm, 1);
  const int64_t grid = std::min(num_items, resident);
  hopper<<<unsigned(grid), kThreads, smem, stream>>>(p, k_map, v_map, int(num_items), int(num_kv_heads),
                                                      int(num_seqs), int(m_tiles));
  KBN_CUDA_CHECK_LAUNCH();
  return true;
}

// KV: the pages' type (T, or __nv_fp8_e4m3). Hopper's kernel when it can run (16-bit pages; fp8 pages at heads 64 and
// 128), else the mma.sync kernel.
template <class T, class KV, int kHeadDim>
void launch_flash_attn_prefill(const PrefillParams& p, int64_t num_seqs, int64_t num_kv_heads, int64_t max_query_len,
                               int64_t num_blocks, Stream stream) {
  int device = 0;
  KBN_CUDA_CHECK(cudaGetDevice(&device));
  if constexpr (kHeadDim == 64) {
    // A short sliding window: one 160-key tile per item where the pages divide it (else the 128-key tiles).
    if (p.feat.window > 0 && p.feat.window <= hopper_path::kWindowTileMaxWindow &&
        launch_hopper_prefill<T, KV, kHeadDim, kHeadDim, hopper_path::kWindowBlockN>(
            p, num_seqs, num_kv_heads, max_query_len, num_blocks, device, stream))
      return;
  }
  if constexpr (std::is_same_v<KV, T> || kHeadDim == 64 || kHeadDim == 128) {
    if (launch_hopper_prefill<T, KV, kHeadDim, kHeadDim>(p, num_seqs, num_kv_heads, max_query_len, num_blocks, device,
                                                         stream))
      return;
  }
  using namespace mma_path;
  const int64_t m_tiles = (max_query_len * p.group_size + kBlockM - 1) / kBlockM;
  KBN_CHECK(m_tiles <= 65535, "flash_attn_prefill: max_query_len ", max_query_len, " x ", p.group_size,
            " query heads per kv head needs ", m_tiles, " query tiles of ", kBlockM, " rows; at most 65535 supported");
  auto* kernel = flash_attn_prefill_mma_kernel<T, KV, kHeadDim>;
  constexpr size_t smem = prefill_mma_smem_bytes<kHeadDim, T, KV>();
  (void)kernel_launch_facts(reinterpret_cast<const void*>(kernel), device, kThreads, smem);  // smem opt-in, once
  const dim3 grid{unsigned(num_kv_heads), unsigned(m_tiles), unsigned(num_seqs)};
  kernel<<<grid, kThreads, smem, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

// The head sizes prefill runs on tensor cores: the shared set (attention_mma.cuh) plus 192 (DeepSeek MLA's
// decompressed prefill) and 256 (Gemma-3): Hopper's wgmma kernel, else mma.sync.
bool prefill_tensor_core_supports(DType dt, int64_t head_size) {
  const bool sixteen_bit = dt == DType::bf16 || dt == DType::f16;
  return tensor_core_attention_supports(dt, head_size) || ((head_size == 192 || head_size == 256) && sixteen_bit);
}

template <class F>
void dispatch_prefill_head_size(int64_t head_size, const char* op, F&& f) {
  if (head_size == 192) return f(std::integral_constant<int, 192>{});
  if (head_size == 256) return f(std::integral_constant<int, 256>{});
  dispatch_head_size(head_size, op, f);
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

bool FlashAttnPrefill::value_width_on_tensor_cores(DType dt, int64_t head_size, int64_t head_size_v, Device device) {
#ifdef KBN_WITH_CUDA
  using hopper_path::kNarrowKeyDim, hopper_path::kNarrowValueDim, hopper_path::flash_attn_prefill_tma_kernel;
  if (!device.is_cuda() || head_size != kNarrowKeyDim || head_size_v != kNarrowValueDim ||
      (dt != DType::bf16 && dt != DType::f16))
    return false;
  const void* kernel =
      dt == DType::bf16
          ? reinterpret_cast<const void*>(
                flash_attn_prefill_tma_kernel<__nv_bfloat16, __nv_bfloat16, kNarrowKeyDim, kNarrowValueDim>)
          : reinterpret_cast<const void*>(flash_attn_prefill_tma_kernel<__half, __half, kNarrowKeyDim, kNarrowValueDim>);
  return runs_sm90_image(kernel, device.index);
#else
  (void)dt, (void)head_size, (void)head_size_v, (void)device;
  return false;
#endif
}

FlashAttnPrefill::FlashAttnPrefill(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads,
                                    int64_t sliding_window, double logits_soft_cap)
    : num_heads_(num_heads),
      head_size_(head_size),
      num_kv_heads_(num_kv_heads),
      scale_(scale),
      sliding_window_(sliding_window),
      logits_soft_cap_(logits_soft_cap) {
  KBN_CHECK(num_heads > 0, "FlashAttnPrefill: argument 'num_heads' must be positive, got ", num_heads);
  KBN_CHECK(head_size > 0, "FlashAttnPrefill: argument 'head_size' must be positive, got ", head_size);
  KBN_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "FlashAttnPrefill: argument 'num_kv_heads' (",
            num_kv_heads, ") must be positive and divide 'num_heads' (", num_heads, ")");
  KBN_CHECK(scale > 0, "FlashAttnPrefill: argument 'scale' must be positive, got ", scale);
  KBN_CHECK(sliding_window >= 0, "FlashAttnPrefill: argument 'sliding_window' must be >= 0 (0: no window), got ",
            sliding_window);
  KBN_CHECK(std::isfinite(logits_soft_cap) && logits_soft_cap >= 0, "FlashAttnPrefill: argument 'logits_soft_cap' must be "
            "finite and >= 0 (0: none), got ", logits_soft_cap);
}

Tensor FlashAttnPrefill::forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                 const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables,
                                 int64_t max_query_len, int64_t max_seq_len, const KVScales& scales) {
  return run(q, key_cache, value_cache, query_start_loc, seq_lens, block_tables, max_query_len, max_seq_len, nullptr,
             scales);
}

Tensor FlashAttnPrefill::forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                 const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables,
                                 int64_t max_query_len, int64_t max_seq_len, const Tensor& sinks,
                                 const KVScales& scales) {
  return run(q, key_cache, value_cache, query_start_loc, seq_lens, block_tables, max_query_len, max_seq_len, &sinks,
             scales);
}

Tensor FlashAttnPrefill::run(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                             const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables,
                             int64_t max_query_len, int64_t max_seq_len, const Tensor* sinks,
                             const KVScales& scales) {
  constexpr const char* op = "flash_attn_prefill";
  check_rank(q, op, "q", 3, "[num_tokens, num_heads, head_size]");
  check_size(q, op, "q", 1, num_heads_, "num_heads");
  check_size(q, op, "q", 2, head_size_, "head_size");
  check_dtype(q, op, "q", {DType::f32, DType::f16, DType::bf16});
  for (const auto& [cache, name] : {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}}) {
    check_rank(*cache, op, name, 4, "[num_blocks, block_size, num_kv_heads, head_size]");
    check_size(*cache, op, name, 2, num_kv_heads_, "num_kv_heads");
    if (cache == &key_cache) check_size(*cache, op, name, 3, head_size_, "head_size");
    // fp8 e4m3 pages (--kv-cache-dtype fp8_e4m3): the mma.sync kernel widens them per tile (16-bit q), the generic
    // kernel otherwise.
    if (cache->dtype() != DType::fp8e4m3) check_same_dtype(*cache, q, op, name, "q");
    check_same_device(*cache, q, op, name, "q");
  }
  // The values' width may differ from the keys' (flash_attn_varlen_func's v: DeepSeek's MLA prefill has keys of 192 and
  // values of 128); the output takes it.
  KBN_CHECK(value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1) &&
                value_cache.size(3) > 0,
            op, ": argument 'value_cache' ", value_cache.str(), " must match 'key_cache' ", key_cache.str(),
            " in num_blocks, block_size and num_kv_heads, with a positive head_size_v");
  check_same_dtype(value_cache, key_cache, op, "value_cache", "key_cache");
  const int64_t head_size_v = value_cache.size(3);
  KBN_CHECK(key_cache.size(1) > 0, op, ": argument 'key_cache' must have a positive block_size, got ", key_cache.str());
  check_rank(query_start_loc, op, "query_start_loc", 1, "[num_seqs + 1]");
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  const int64_t num_seqs = seq_lens.size(0);
  check_size(query_start_loc, op, "query_start_loc", 0, num_seqs + 1, "num_seqs + 1 (seq_lens.size(0) + 1)");
  check_size(block_tables, op, "block_tables", 0, num_seqs, "num_seqs (seq_lens.size(0))");
  for (const auto& [meta, name] : {std::pair{&query_start_loc, "query_start_loc"}, std::pair{&seq_lens, "seq_lens"},
                                   std::pair{&block_tables, "block_tables"}}) {
    check_dtype(*meta, op, name, {DType::i32});
    check_same_device(*meta, q, op, name, "q");
  }
  if (sinks) {
    reference::check_attention_sinks(op, *sinks, num_heads_);
    check_same_device(*sinks, q, op, "sinks", "q");
  }
  check_kv_scales(op, scales, key_cache.dtype());
  const double scale = scale_ * scales.k;  // fp8 keys read as e * k_scale: the factor joins the softmax scale

  const int64_t num_tokens = q.size(0);
  Tensor out = Tensor::empty({num_tokens, num_heads_, head_size_v}, q.dtype(), q.device());
  if (num_tokens == 0) return out;
  KBN_CHECK(max_query_len > 0, op, ": argument 'max_query_len' must be positive when q has tokens, got ", max_query_len,
            " for ", q.str());
  KBN_CHECK(max_seq_len > 0, op, ": argument 'max_seq_len' must be positive when q has tokens, got ", max_seq_len);
  KBN_CHECK(max_query_len <= max_seq_len, op, ": argument 'max_query_len' (", max_query_len,
            ") cannot exceed 'max_seq_len' (", max_seq_len, "): the new tokens are part of the sequence");

  if (q.is_cpu()) {
    reference::paged_attention_prefill(out, q, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale_,
                                       {sliding_window_, logits_soft_cap_, sinks, scales});
    return out;
  }
#ifdef KBN_WITH_CUDA
  check_last_dim_contiguous(q, op, "q");
  check_aligned(q, op, "q", 16);
  check_last_dim_contiguous(key_cache, op, "key_cache");
  check_aligned(key_cache, op, "key_cache", 16);
  check_last_dim_contiguous(value_cache, op, "value_cache");
  check_aligned(value_cache, op, "value_cache", 16);
  check_contiguous(query_start_loc, op, "query_start_loc");
  check_contiguous(seq_lens, op, "seq_lens");
  check_last_dim_contiguous(block_tables, op, "block_tables");
  KBN_CHECK(num_seqs <= 65535, op, ": at most 65535 sequences per launch, got ", num_seqs);

  Tensor sinks_f32;  // holds the f32 sinks until the launch is enqueued
  const AttnFeatures feat = attn_features(sliding_window_, logits_soft_cap_, scale, sinks, sinks_f32, scales.v);
  auto generic = [&] {
    GenericAttnParams g = generic_attention_params(q, key_cache, value_cache, out, &query_start_loc, seq_lens,
                                                   block_tables, num_heads_, num_kv_heads_, head_size_, scale);
    set_generic_features(g, feat, logits_soft_cap_);
    launch_generic_attention(g, q.dtype(), key_cache.dtype(), num_tokens, num_heads_, op, current_stream());
    return out;
  };
  if (!prefill_tensor_core_supports(q.dtype(), head_size_)) return generic();
  PrefillParams p{};
  p.q = q.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.out = out.data_ptr();
  p.query_start_loc = query_start_loc.data<int32_t>();
  p.seq_lens = seq_lens.data<int32_t>();
  p.block_tables = block_tables.data<int32_t>();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.k_stride_block = key_cache.stride(0);
  p.k_stride_slot = key_cache.stride(1);
  p.k_stride_head = key_cache.stride(2);
  p.v_stride_block = value_cache.stride(0);
  p.v_stride_slot = value_cache.stride(1);
  p.v_stride_head = value_cache.stride(2);
  p.block_table_stride = block_tables.stride(0);
  p.block_size = int(key_cache.size(1));
  p.block_shift = (p.block_size & (p.block_size - 1)) == 0 ? __builtin_ctz(unsigned(p.block_size)) : -1;
  p.group_size = int(num_heads_ / num_kv_heads_);
  p.scale_log2 = float(scale * 1.4426950408889634);
  p.feat = feat;
  const bool fp8_pages = key_cache.dtype() == DType::fp8e4m3;
  if (head_size_v != head_size_) {
    // Keys 192 / values 128 (DeepSeek's MLA) on Hopper's kernel with 16-bit pages; any other pair, GPU, page size or
    // fp8 pages: the generic kernel (the mma.sync kernel reads values as wide as keys only).
    bool launched = false;
    using hopper_path::kNarrowKeyDim, hopper_path::kNarrowValueDim;
    if (head_size_ == kNarrowKeyDim && head_size_v == kNarrowValueDim && !fp8_pages) {
      int device = 0;
      KBN_CUDA_CHECK(cudaGetDevice(&device));
      dispatch_float16(q.dtype(), op, "q", [&](auto t) {
        launched = launch_hopper_prefill<decltype(t), decltype(t), kNarrowKeyDim, kNarrowValueDim>(
            p, num_seqs, num_kv_heads_, max_query_len, key_cache.size(0), device, current_stream());
      });
    }
    return launched ? out : generic();
  }
  dispatch_float16(q.dtype(), op, "q", [&](auto t) {
    using T = decltype(t);
    dispatch_prefill_head_size(head_size_, op, [&](auto d) {
      if (fp8_pages)
        launch_flash_attn_prefill<T, __nv_fp8_e4m3, decltype(d)::value>(p, num_seqs, num_kv_heads_, max_query_len,
                                                                         key_cache.size(0), current_stream());
      else
        launch_flash_attn_prefill<T, T, decltype(d)::value>(p, num_seqs, num_kv_heads_, max_query_len,
                                                            key_cache.size(0), current_stream());
    });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
