#include "L1/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
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

// ---- kernel layer ----

struct MlaDecodeParams {
  const void* q;           // [num_seqs, num_heads, width], last dim contiguous
  const void* kv_cache;    // [num_blocks, block_size, width] contiguous
  void* out;               // [num_seqs, num_heads, rank] contiguous; written directly when num_splits == 1
  float* partial_out;      // [num_seqs, num_heads, num_splits, rank]: each split's normalised output
  float* partial_max_sum;  // [num_seqs, num_heads, num_splits, 2]: each split's (max in the exp2 domain, sum)
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t q_stride_seq, q_stride_head, block_table_stride;
  int num_heads, block_size, width, rank;
  int num_splits, partition_keys;  // keys [split * partition_keys, +partition_keys) of a sequence per block
  float scale_log2;                // softmax scale * log2(e)
};

// Tensor-core kernel for DeepSeek's latent (512 + 64, 16-bit). grid = (num_splits, ceil(num_heads / 16), num_seqs);
// 4 warps. A block holds 16 query heads (the M of an m16n8k16 mma; missing heads are zero rows) and walks its keys in
// tiles of kKeys latent rows through a kStages-deep cp.async ring, so each latent byte is read once per 16 heads:
//   scores: warp w computes S[16 heads, its 16 keys] over the 576-wide rows (36 k-steps);
//   softmax: the row maxima meet in shared memory, every warp rescales with the same running max, and writes its
//            probabilities (16-bit) to shared memory;
//   values:  warp w accumulates O[16 heads, columns 128w..128w+127] += P[16, kKeys] V[kKeys, 128] (V = the rows'
//            first 512 values), so the 16 x 512 fp32 output lives in registers spread over the four warps (64 each).
// Latent and P rows are XOR-swizzled by 16-byte chunk (attention_mma.cuh) so ldmatrix and cp.async are conflict-free.
// 64-key tiles double-buffered: on the H200 32-key tiles four deep were slower (V3 52-54 TFLOP/s against 70-71,
// DeepSeek-V2-Lite 38-40% of the copy rate at batch 32-128), their per-tile barriers twice as many.
constexpr int kMlaWidth = 576, kMlaRank = 512, kMlaRows = 16, kMlaWarps = 4, kMlaThreads = kMlaWarps * 32,
              kMlaChunks = kMlaWidth / 8, kMlaKeys = 64, kMlaStages = 2;
constexpr size_t kMlaSmem = size_t(kMlaRows + kMlaStages * kMlaKeys) * kMlaWidth * 2 + size_t(kMlaRows) * kMlaKeys * 2 +
                            2 * kMlaWarps * kMlaRows * sizeof(float);

// Normalised O rows straight to `out` when the sequence has one split, else to the split's fp32 partial with its
// (max, sum): this thread's accumulators o[n][0..1] (row head_g) and o[n][2..3] (row head_g + 8) of columns
// col0 + 8n + 2 t4, l = the rows' sums; `stats`: this thread writes the rows' (max, sum).
template <class T, int kN>
__device__ __forceinline__ void store_mla_output(const MlaDecodeParams& p, const float (&o)[kN][4],
                                                 const float (&m_run)[2], const float (&l)[2], int seq, int split,
                                                 int head_g, int col0, int t4, bool stats) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head_g + 8 * r;
    if (head >= p.num_heads) continue;
    const float inv = 1.f / l[r];
    if (p.num_splits == 1) {
      T* dst = static_cast<T*>(p.out) + (int64_t(seq) * p.num_heads + head) * kMlaRank + col0 + 2 * t4;
#pragma unroll
      for (int n = 0; n < kN; ++n)
        *reinterpret_cast<uint32_t*>(dst + 8 * n) = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    } else {
      const int64_t row = (int64_t(seq) * p.num_heads + head) * p.num_splits + split;
      float* dst = p.partial_out + row * kMlaRank + col0 + 2 * t4;
#pragma unroll
      for (int n = 0; n < kN; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      if (stats) {
        p.partial_max_sum[2 * row] = m_run[r];
        p.partial_max_sum[2 * row + 1] = l[r];
      }
    }
  }
}

// A partition with no keys: only a lone split writes its rows of `out` (zeros), `rows` heads from head0 over `threads`
// threads; the reduce skips empty splits.
template <class T>
__device__ __forceinline__ void store_empty_mla_output(const MlaDecodeParams& p, int seq, int head0, int rows, int tid,
                                                       int threads) {
  if (p.num_splits != 1) return;
  T* out = static_cast<T*>(p.out);
  for (int i = tid; i < rows * kMlaRank; i += threads) {
    const int head = head0 + i / kMlaRank;
    if (head < p.num_heads) out[(int64_t(seq) * p.num_heads + head) * kMlaRank + i % kMlaRank] = T(0.f);
  }
}

// The per-tile steps both tensor-core kernels share. A block's four math warps hold O[16 heads, 512] (warp w columns
// 128w..128w+127) and the running max / sum of this thread's rows g and g + 8; `sync` is the barrier of those four
// warps (__syncthreads, or a named barrier where a producer warp does not join).

// Online softmax of one tile: this warp's scores s (kNT n-tiles of 8 keys from tile_key0; keys at or past key_end
// masked) scaled into the exp2 domain, the row maxima met across the warps in sMax, O and the sums rescaled, and the
// probabilities written (16-bit) to the tile's P rows at p_at(row, col).
template <class T, int kNT, class PAt, class Sync>
__device__ __forceinline__ void mla_tile_softmax(float (&s)[kNT][4], int tile_key0, int key_end, float scale_log2,
                                                 float* sMax, T* sP, PAt p_at, float (&m_run)[2], float (&l_run)[2],
                                                 float (&o)[16][4], int warp, int g, int t4, Sync sync) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = tile_key0 + 8 * j + 2 * t4 + (c & 1);
      s[j][c] = key < key_end ? s[j][c] * scale_log2 : -INFINITY;
      mx[c / 2] = fmaxf(mx[c / 2], s[j][c]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  if (t4 == 0) {
    sMax[warp * kMlaRows + g] = mx[0];
    sMax[warp * kMlaRows + g + 8] = mx[1];
  }
  sync();
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = m_run[r];
#pragma unroll
    for (int w = 0; w < kMlaWarps; ++w) m = fmaxf(m, sMax[w * kMlaRows + g + 8 * r]);
    alpha[r] = exp2f(m_run[r] - m);  // the tile has a valid key, so m is finite
    m_run[r] = m;
    l_run[r] *= alpha[r];
  }
  constexpr int kWarpKeys = 8 * kNT;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const float p0 = exp2f(s[j][0] - m_run[0]), p1 = exp2f(s[j][1] - m_run[0]);
    const float p2 = exp2f(s[j][2] - m_run[1]), p3 = exp2f(s[j][3] - m_run[1]);
    l_run[0] += p0 + p1;
    l_run[1] += p2 + p3;
    const int col = warp * kWarpKeys + 8 * j + 2 * t4;
    *reinterpret_cast<uint32_t*>(sP + p_at(g, col)) = pack2<T>(p0, p1);
    *reinterpret_cast<uint32_t*>(sP + p_at(g + 8, col)) = pack2<T>(p2, p3);
  }
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
  sync();
}

// O[:, 128w .. 128w + 127] += P V over a tile of kKeys keys (k-steps of 16); v_at(key, chunk) is the shared address
// of 16-byte chunk `chunk` of the tile's row `key` (V = the rows' first 512 values).
template <class T, int kKeys, class PAt, class VAt>
__device__ __forceinline__ void mla_tile_pv(float (&o)[16][4], const T* sP, PAt p_at, VAt v_at, int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(sP + p_at(lane % 16, 16 * kk + (lane / 16) * 8)));
    const int key = 16 * kk + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int n = 0; n < 16; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_at(key, warp * 16 + n + lane / 16));
      mma_16816<T>(o[n], a, b[0], b[1]);
      mma_16816<T>(o[n + 1], a, b[2], b[3]);
    }
  }
}

// The rows' softmax sums: this thread's partial sums over the quad, then over the four warps through sSum.
template <class Sync>
__device__ __forceinline__ void mla_row_sums(float (&l_run)[2], float* sSum, float (&l)[2], int warp, int g, int t4,
                                             Sync sync) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (t4 == 0) {
    sSum[warp * kMlaRows + g] = l_run[0];
    sSum[warp * kMlaRows + g + 8] = l_run[1];
  }
  sync();
  l[0] = l[1] = 0.f;
#pragma unroll
  for (int w = 0; w < kMlaWarps; ++w) {
    l[0] += sSum[w * kMlaRows + g];
    l[1] += sSum[w * kMlaRows + g + 8];
  }
}

template <class T>
__global__ void __launch_bounds__(kMlaThreads, 1) mla_decode_mma_kernel(MlaDecodeParams p) {
  constexpr int kKeys = kMlaKeys, kStages = kMlaStages;
  constexpr int kWarpKeys = kKeys / kMlaWarps, kNT = kWarpKeys / 8;  // a warp owns 16 keys: two n-tiles
  auto p_at = [](int row, int col) { return swizzle<kKeys>(row, col / 8) + col % 8; };  // P rows XOR-swizzled
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sKV = sQ + kMlaRows * kMlaWidth;                             // [kStages][kKeys][kMlaWidth]
  T* sP = sKV + kStages * kKeys * kMlaWidth;                      // [kMlaRows][kKeys]
  float* sMax = reinterpret_cast<float*>(sP + kMlaRows * kKeys);  // [kMlaWarps][kMlaRows]
  float* sSum = sMax + kMlaWarps * kMlaRows;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int split = blockIdx.x, head0 = blockIdx.y * kMlaRows, seq = blockIdx.z;
  const int seq_len = p.seq_lens[seq];
  const int key_begin = split * p.partition_keys;
  const int key_end = min(seq_len, key_begin + p.partition_keys);

  if (key_begin >= key_end) {
    store_empty_mla_output<T>(p, seq, head0, kMlaRows, tid, kMlaThreads);
    return;
  }

  // Q: 16 rows of 72 chunks; rows past num_heads are zeros.
  const T* q = static_cast<const T*>(p.q) + int64_t(seq) * p.q_stride_seq;
  for (int i = tid; i < kMlaRows * kMlaChunks; i += kMlaThreads) {
    const int row = i / kMlaChunks, ch = i % kMlaChunks;
    const bool valid = head0 + row < p.num_heads;
    const T* src = q + int64_t(valid ? head0 + row : 0) * p.q_stride_head + ch * 8;
    cp_async_16(smem_addr(sQ + swizzle<kMlaWidth>(row, ch)), src, valid);
  }
  const T* cache = static_cast<const T*>(p.kv_cache);
  const int32_t* table = p.block_tables + int64_t(seq) * p.block_table_stride;
  const int num_tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  // Lanes 0 .. kWarpKeys-1 of warp w look up the slot of row kWarpKeys w + lane of a tile (-1: past key_end, a zero
  // row whose score is masked); each lookup is issued one tile ahead of its copies, so no block-table read sits
  // between a tile's compute and the next copies.
  auto row_slot = [&](int tile) -> int64_t {
    const int key = key_begin + tile * kKeys + warp * kWarpKeys + lane % kWarpKeys;
    if (tile >= num_tiles || key >= key_end) return -1;
    return int64_t(table[key / p.block_size]) * p.block_size + key % p.block_size;
  };
  // A tile into stage `stage`: warp w copies its kWarpKeys rows, a row of 72 chunks per step (lanes 0-31, 32-63, then
  // 8 lanes for 64-71: 512 contiguous bytes per instruction).
  auto load_tile = [&](int stage, int64_t my_slot) {
    T* dst = sKV + stage * kKeys * kMlaWidth;
#pragma unroll 4
    for (int i = 0; i < kWarpKeys; ++i) {
      const int64_t slot = __shfl_sync(0xffffffffu, my_slot, i);
      const bool valid = slot >= 0;
      const T* src = cache + (valid ? slot : 0) * kMlaWidth;
      const int r = warp * kWarpKeys + i;
      for (int ch = lane; ch < kMlaChunks; ch += 32)
        cp_async_16(smem_addr(dst + swizzle<kMlaWidth>(r, ch)), src + ch * 8, valid);
    }
  };
  // Prologue: Q and tiles 0 .. kStages-2, one commit group per tile (Q rides with tile 0); the ring then issues
  // tile t + kStages - 1 at the top of iteration t (an empty group past the last tile keeps the count uniform).
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < num_tiles) load_tile(t, row_slot(t));
    cp_async_commit();
  }
  int64_t next_slot = row_slot(kStages - 1);

  float o[16][4];  // O[16 heads, 128w + 8n + {2t4, 2t4+1}] for rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + kStages - 1 < num_tiles) load_tile((tile + kStages - 1) % kStages, next_slot);
    cp_async_commit();
    next_slot = row_slot(tile + kStages);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const T* kv = sKV + stage * kKeys * kMlaWidth;

    // Scores of this warp's keys (kNT n-tiles of 8).
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < kMlaChunks / 2; ++kk) {
      uint32_t a[4], b[4];
      ldmatrix_x4(a, smem_addr(sQ + swizzle<kMlaWidth>(lane % 16, 2 * kk + lane / 16)));
      const int key = warp * kWarpKeys + lane % 8 + (lane / 16) * 8;
      ldmatrix_x4(b, smem_addr(kv + swizzle<kMlaWidth>(key, 2 * kk + (lane / 8) % 2)));
      mma_16816<T>(s[0], a, b[0], b[1]);
      mma_16816<T>(s[1], a, b[2], b[3]);
    }
    auto sync = [] { __syncthreads(); };
    mla_tile_softmax<T>(s, key_begin + tile * kKeys + warp * kWarpKeys, key_end, p.scale_log2, sMax, sP, p_at, m_run,
                        l_run, o, warp, g, t4, sync);
    mla_tile_pv<T, kKeys>(o, sP, p_at,
                          [&](int key, int chunk) { return smem_addr(kv + swizzle<kMlaWidth>(key, chunk)); }, warp,
                          lane);
    __syncthreads();
  }
  cp_async_wait<0>();  // the ring's trailing (empty) groups
  float l[2];
  mla_row_sums(l_run, sSum, l, warp, g, t4, [] { __syncthreads(); });
  store_mla_output<T, 16>(p, o, m_run, l, seq, split, head0 + g, warp * 128, t4, warp == 0 && t4 == 0);
}

// Hopper: the same math with the loads taken off the math warps. A fifth (producer) warp copies each latent row of a
// tile with its own bulk copy (cp.async.bulk: the copy engine moves the 1152 bytes, no per-thread 16-byte requests)
// into a kMlaBulkStages-deep ring, completing a "full" mbarrier in bytes; the four math warps hand a stage back on an
// "empty" mbarrier once their P V has read it, and meet on a named barrier (the producer never joins them). Rows are
// kMlaRowStride values apart in shared memory (1168 bytes: consecutive rows start 16 bytes apart modulo 128, so the
// eight rows of an ldmatrix phase hit eight bank groups without a swizzle a row copy could not apply). Rows of a
// tile past the partition's last key are zeroed by the producer (P is 0 there, and 0 x a stale NaN would not be).
// The scores' 36 k-steps accumulate in two independent chains (even and odd steps), halving their mma latency chain.
// P is double-buffered by tile parity, so a warp may write tile t+1's P while another still reads tile t's.
// Measured on an H100 (bench/results/h100/session19/, V2-Lite's 16 heads): 75.9-92.9% of the copy rate at batch
// 32-128 x 4k-8k, 1.30-1.39x the cp.async kernel above in the same run (whose four warps both load and compute).
// NOTE: short partitions (batch 32 x 4k: 75.9%) are where it falls short of 85%: a deeper ring of 32-key tiles (five
// stages fit in 207 KB) would keep more bytes in flight per SM; measure first.
constexpr int kMlaRowStride = kMlaWidth + 8, kMlaBulkStages = 2, kMlaBulkThreads = kMlaThreads + 32;
constexpr uint32_t kMlaRowBytes = kMlaWidth * 2, kMlaStageBytes = uint32_t(kMlaKeys) * kMlaRowStride * 2;
constexpr size_t kMlaBulkSmem = size_t(kMlaBulkStages) * kMlaStageBytes + size_t(kMlaRows) * kMlaWidth * 2 +
                                2 * size_t(kMlaRows) * kMlaKeys * 2 + 2 * kMlaWarps * kMlaRows * sizeof(float) +
                                2 * kMlaBulkStages * 8;
constexpr int kMlaBarMath = 1;  // named barrier of the four math warps (0 is __syncthreads)

template <class T>
__global__ void __launch_bounds__(kMlaBulkThreads, 1) mla_decode_bulk_kernel(MlaDecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kKeys = kMlaKeys, kStages = kMlaBulkStages;
  constexpr int kWarpKeys = kKeys / kMlaWarps, kNT = kWarpKeys / 8;
  auto p_at = [](int row, int col) { return swizzle<kKeys>(row, col / 8) + col % 8; };
  extern __shared__ __align__(128) unsigned char smem[];
  T* sKV = reinterpret_cast<T*>(smem);                              // [kStages][kKeys][kMlaRowStride]
  T* sQ = sKV + kStages * kKeys * kMlaRowStride;                    // [kMlaRows][kMlaWidth], swizzled
  T* sP = sQ + kMlaRows * kMlaWidth;                                // [2][kMlaRows][kKeys]
  float* sMax = reinterpret_cast<float*>(sP + 2 * kMlaRows * kKeys);  // [kMlaWarps][kMlaRows]
  float* sSum = sMax + kMlaWarps * kMlaRows;
  const uint32_t full_bar = smem_addr(sSum + kMlaWarps * kMlaRows);  // [kStages], then empty: [kStages]
  const uint32_t empty_bar = full_bar + 8 * kStages;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int split = blockIdx.x, head0 = blockIdx.y * kMlaRows, seq = blockIdx.z;
  const int seq_len = p.seq_lens[seq];
  const int key_begin = split * p.partition_keys;
  const int key_end = min(seq_len, key_begin + p.partition_keys);

  if (key_begin >= key_end) {
    store_empty_mla_output<T>(p, seq, head0, kMlaRows, tid, kMlaBulkThreads);
    return;
  }
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full_bar + 8 * st, 1);           // the producer's arrive.expect_tx; the copies complete the bytes
      mbar_init(empty_bar + 8 * st, kMlaWarps);  // lane 0 of each math warp after its P V
    }
    mbar_fence_init();
  }
  __syncthreads();
  const int num_tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  const T* cache = static_cast<const T*>(p.kv_cache);

  if (warp == kMlaWarps) {
    // ---- producer warp: lane l copies rows l and l + 32 of every tile ----
    const int32_t* table = p.block_tables + int64_t(seq) * p.block_table_stride;
    auto slot_of = [&](int tile, int row) -> int64_t {  // -1: past the partition's last key
      const int key = key_begin + tile * kKeys + row;
      if (tile >= num_tiles || key >= key_end) return -1;
      return int64_t(table[key / p.block_size]) * p.block_size + key % p.block_size;
    };
    int64_t slot[2] = {slot_of(0, lane), slot_of(0, lane + 32)};
    for (int tile = 0; tile < num_tiles; ++tile) {
      // The next tile's lookups go out before this tile's wait, so no block-table read delays a copy.
      const int64_t next[2] = {slot_of(tile + 1, lane), slot_of(tile + 1, lane + 32)};
      const int stage = tile % kStages;
      if (tile >= kStages) mbar_wait(empty_bar + 8 * stage, uint32_t((tile / kStages - 1) & 1));
      T* dst = sKV + stage * kKeys * kMlaRowStride;
      const int valid = min(kKeys, key_end - key_begin - tile * kKeys);
      if (valid < kKeys) {  // the partition's last tile: zero the rows it does not copy
        for (int i = lane; i < (kKeys - valid) * (kMlaWidth / 8); i += 32) {
          const int r = valid + i / (kMlaWidth / 8), c = i % (kMlaWidth / 8);
          *reinterpret_cast<uint4*>(dst + r * kMlaRowStride + c * 8) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async_shared();  // before later bulk copies overwrite these rows
      }
      __syncwarp();
      // The arrive (release) orders the zero rows before the phase the math warps wait on; the copies complete after.
      if (lane == 0) mbar_arrive_expect_tx(full_bar + 8 * stage, uint32_t(valid) * kMlaRowBytes);
      __syncwarp();
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (slot[h] >= 0)
          bulk_copy_g2s(smem_addr(dst + (lane + 32 * h) * kMlaRowStride), cache + slot[h] * kMlaWidth, kMlaRowBytes,
                        full_bar + 8 * stage);
      slot[0] = next[0];
      slot[1] = next[1];
    }
    return;
  }

  // ---- math warps ----
  const T* q = static_cast<const T*>(p.q) + int64_t(seq) * p.q_stride_seq;
  for (int i = tid; i < kMlaRows * kMlaChunks; i += kMlaThreads) {
    const int row = i / kMlaChunks, ch = i % kMlaChunks;
    const bool valid = head0 + row < p.num_heads;
    const T* src = q + int64_t(valid ? head0 + row : 0) * p.q_stride_head + ch * 8;
    cp_async_16(smem_addr(sQ + swizzle<kMlaWidth>(row, ch)), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  named_sync(kMlaBarMath, kMlaThreads);

  float o[16][4];  // O[16 heads, 128w + 8n + {2t4, 2t4+1}] for rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    mbar_wait(full_bar + 8 * stage, uint32_t((tile / kStages) & 1));
    const T* kv = sKV + stage * kKeys * kMlaRowStride;
    T* pt = sP + (tile & 1) * kMlaRows * kKeys;

    // Scores of this warp's keys (kNT n-tiles of 8), even and odd k-steps in separate accumulators.
    float s[kNT][4], s_odd[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[j][c] = s_odd[j][c] = 0.f;
    const int key_row = warp * kWarpKeys + lane % 8 + (lane / 16) * 8;
#pragma unroll 4
    for (int kk = 0; kk < kMlaChunks / 2; kk += 2) {
      uint32_t a[4], b[4], a2[4], b2[4];
      ldmatrix_x4(a, smem_addr(sQ + swizzle<kMlaWidth>(lane % 16, 2 * kk + lane / 16)));
      ldmatrix_x4(b, smem_addr(kv + key_row * kMlaRowStride + (2 * kk + (lane / 8) % 2) * 8));
      ldmatrix_x4(a2, smem_addr(sQ + swizzle<kMlaWidth>(lane % 16, 2 * kk + 2 + lane / 16)));
      ldmatrix_x4(b2, smem_addr(kv + key_row * kMlaRowStride + (2 * kk + 2 + (lane / 8) % 2) * 8));
      mma_16816<T>(s[0], a, b[0], b[1]);
      mma_16816<T>(s[1], a, b[2], b[3]);
      mma_16816<T>(s_odd[0], a2, b2[0], b2[1]);
      mma_16816<T>(s_odd[1], a2, b2[2], b2[3]);
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[j][c] += s_odd[j][c];
    auto sync = [] { named_sync(kMlaBarMath, kMlaThreads); };
    mla_tile_softmax<T>(s, key_begin + tile * kKeys + warp * kWarpKeys, key_end, p.scale_log2, sMax, pt, p_at, m_run,
                        l_run, o, warp, g, t4, sync);
    mla_tile_pv<T, kKeys>(o, pt, p_at,
                          [&](int key, int chunk) { return smem_addr(kv + key * kMlaRowStride + chunk * 8); }, warp,
                          lane);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar + 8 * stage);  // this warp is done with the stage
  }

  float l[2];
  mla_row_sums(l_run, sSum, l, warp, g, t4, [] { named_sync(kMlaBarMath, kMlaThreads); });
  store_mla_output<T, 16>(p, o, m_run, l, seq, split, head0 + g, warp * 128, t4, warp == 0 && t4 == 0);
#else
  __trap();  // not launched: the host picks this kernel only when the binary holds sm_90 code for the device
#endif
}

// Hopper, heads in tiles of 64 (V3's 128 heads, or several query tokens' worth): the same decode on warpgroup MMAs,
// the structure of FlashMLA's kernel. With 16 heads per block the latent bytes set the pace; with 128 heads the
// mma.sync kernels above are bound by their own shared-memory traffic (each 16-head block re-reads the tile through
// ldmatrix: V3 at ~100 TFLOP/s on an H100). Here a block owns 64 heads, so each operand byte read from shared memory
// feeds four times the multiply-adds:
//   producer warpgroup (setmaxnreg 24): one thread copies each tile of kKeys latent rows with TMA (a 2-D tensor map
//     over the cache's rows, boxes of up to kKeys rows x 64 values, 128-byte swizzled as wgmma reads them) into a
//     kStages-deep ring of full/empty mbarriers;
//   warpgroup 0: S[64 heads, kKeys] = Q K^T (wgmma, both operands in shared memory, 36 k-steps of the 576-wide rows),
//     the online softmax, P to shared memory as its register fragments, then O[:, 0:256] += P V;
//   warpgroup 1: takes P and the rescale factors from shared memory and runs O[:, 256:512] += P V.
// O is 64 x 256 fp32 per warpgroup (128 registers a thread). Warpgroup 0 issues its P V and goes straight on to the
// next tile's S, so the tensor cores see S_{t+1} behind both halves of P_t V_t. Rows of the last tile past the
// partition's end are zeroed before P V (0 x a stale NaN). Needs pages of 8..kKeys keys dividing kKeys, or multiples
// of kKeys.
// Measured on an H100 (bench/results/h100/session20/, V3's 128 heads, pages of 16): with 64-key tiles in two stages
// 276-339 TFLOP/s at batch 32-128 x 4k-8k (4.0-4.7x session 18's cp.async kernel, about 3.3x the bulk kernel), and
// ncu found it waiting on the copies (one 72 KiB tile in flight per SM; DRAM 43% of peak, tensor pipe 37%); 32-key
// tiles in four stages, the same bytes with three tiles in flight, run 1.12-1.33x faster in the same run: 336-442
// TFLOP/s, 49-62% of copy bandwidth (call6). DRAM reads equal the latent's bytes: the two 64-head tiles of a sequence
// share them through L2. Sharing S between the warpgroups (each half the keys, maxima and P exchanged) was 0.90-0.96x
// (call4).
// P_{t-1} V_{t-1} issued behind S_t in warpgroup 0, so that its softmax overlaps the tensor cores, took 1.30-1.67x
// the time (bench/results/h100/session21/, call 3: rejected).
// Building each k-step's descriptors with one add from the tile's bases (Sw128Desc) instead of from the addresses
// cut warpgroup 0's S loop from 454 to 182 instructions per tile and ran 1.04-1.06x faster at batch 32-128 x 4k-8k
// (bench/results/h100/session22/call2/: 128 x 8k 630.5 us, 463 TFLOP/s, 65% of the copy rate). ncu then finds
// warpgroup 0 waiting on its own S wgmmas (36 m64n32k16 behind its P V half; tensor pipe 47.7% of elapsed) and
// warpgroup 1 waiting for P 76% of its time: S's small N re-reads Q's 2 KiB from shared memory per 1 KiB of keys.
// Issuing S_{t+1} before tile t's softmax (FlashAttention-3's intra-warpgroup overlap, two S and two P register sets)
// makes ptxas serialize every wgmma of the kernel (C7515, "non wgmma instructions defining accumulator registers
// ... between start and end of the pipeline stage") in every arrangement tried on CUDA 13: P V's A operand from
// registers or from shared memory, O rescaled lazily or not at all, no register fences on O (session 22; the
// attempt is bench/results/h100/session22/rejected_mla_s_ahead.patch). It compiles cleanly only with P_t V_t issued
// before S_{t+1}, the order above.
// NOTE: FlashMLA publishes 580-660 TFLOP/s on an H800. Next, measure first: a 2-CTA cluster multicasting each tile to
// both head tiles (half the L2 traffic and copies per block).
constexpr int kMlaWgRows = 64, kMlaWgThreads = 384;
constexpr uint32_t kMlaWgQTile = kMlaWidth / 64 * kMlaWgRows * 128;  // Q: 9 blocks of 64 rows x 128 bytes, 72 KiB
// The ring: kKeys latent rows per tile, kStages tiles. Q takes 72 KiB of the 227, so 64-key tiles fit twice and
// 32-key tiles four times (the same bytes, more tiles in flight).
template <int kKeys, int kStages>
struct MlaWgConfig {
  static constexpr uint32_t kBlock = kKeys * 128;            // one 64-column block of a tile
  static constexpr uint32_t kTile = kMlaWidth / 64 * kBlock;  // 9 blocks
  static constexpr int kSteps = kKeys / 16;                   // P V's k-steps
  static constexpr uint32_t kPWords = (4 * kSteps + 2) * 128;  // P fragments and two rescale factors per thread
  static constexpr size_t kSmem = 1024 + kMlaWgQTile + size_t(kTile) * kStages + kPWords * 4 + 2 * kStages * 8;
  static_assert(kKeys == 32 || kKeys == 64, "S is one m64n32 or m64n64 wgmma per k-step");
  static_assert(kSmem <= 232448, "227 KiB of shared memory per block");
};
// Named barriers (0 is __syncthreads): warpgroup 0's Q landed / zero rows written; P ready (warpgroup 0 arrives,
// 1 waits); P taken (1 arrives, 0 waits); the row statistics written (0 arrives, 1 waits).
constexpr int kMlaWgBarOwn = 1, kMlaWgBarPReady = 2, kMlaWgBarPTaken = 3, kMlaWgBarStats = 4;
// The ring the op launches: 32-key tiles, four stages (1.12-1.33x 64-key tiles in two; see above the kernel).
constexpr int kMlaWgKeys = 32, kMlaWgStages = 4;
using MlaWg = MlaWgConfig<kMlaWgKeys, kMlaWgStages>;

template <class T, int kKeys, int kStages>
__global__ void __launch_bounds__(kMlaWgThreads, 1)
    mla_decode_wgmma_kernel(MlaDecodeParams p, const __grid_constant__ CUtensorMap kv_map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_decode: wgmma needs Hopper's arch-specific target: KBN_CUDA_GENCODE -gencode=arch=compute_90a,code=sm_90a, not compute_90"
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = MlaWgConfig<kKeys, kStages>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t q_s = (raw_addr + 1023u) & ~1023u;  // swizzle atoms start 1024-byte aligned
  const uint32_t kv_s = q_s + kMlaWgQTile;           // [kStages][9 blocks][kKeys rows][128 bytes]
  uint32_t* sP = reinterpret_cast<uint32_t*>(smem_raw + (kv_s + kStages * C::kTile - raw_addr));
  const uint32_t full_bar = kv_s + kStages * C::kTile + C::kPWords * 4;
  const uint32_t empty_bar = full_bar + 8 * kStages;

  const int tid = threadIdx.x, lane = tid % 32;
  const int split = blockIdx.x, head0 = blockIdx.y * kMlaWgRows, seq = blockIdx.z;
  const int seq_len = p.seq_lens[seq];
  const int key_begin = split * p.partition_keys;
  const int key_end = min(seq_len, key_begin + p.partition_keys);
  if (key_begin >= key_end) {
    store_empty_mla_output<T>(p, seq, head0, kMlaWgRows, tid, kMlaWgThreads);
    return;
  }
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full_bar + 8 * st, 1);  // the producer's arrive.expect_tx; the copies complete the bytes
      mbar_init(empty_bar + 8 * st, 8);  // lane 0 of each consumer warp once its P V (and S) are done
    }
    mbar_fence_init();
  }
  __syncthreads();
  const int num_tiles = (key_end - key_begin + kKeys - 1) / kKeys;

  if (tid >= 256) {
    // ---- producer warpgroup: one thread issues every copy ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 256) {
      const int bs = p.block_size;
      const int box_rows = min(bs, kKeys);
      const int32_t* table = p.block_tables + int64_t(seq) * p.block_table_stride;
      for (int tile = 0; tile < num_tiles; ++tile) {
        const int stage = tile % kStages;
        if (tile >= kStages) mbar_wait(empty_bar + 8 * stage, uint32_t((tile / kStages - 1) & 1));
        const int n0 = key_begin + tile * kKeys;
        const int boxes = (min(key_end - n0, kKeys) + box_rows - 1) / box_rows;  // boxes holding keys < key_end
        const uint32_t bar = full_bar + 8 * stage;
        mbar_arrive_expect_tx(bar, uint32_t(boxes * box_rows) * kMlaWidth * 2);
        for (int j = 0; j < boxes; ++j) {
          const int key = n0 + j * box_rows;
          const int row = table[key / bs] * bs + key % bs;  // the cache's row (num_blocks x block_size fits int)
          const uint32_t dst = kv_s + stage * C::kTile + j * box_rows * 128;
#pragma unroll
          for (int b = 0; b < kMlaWidth / 64; ++b) tma_load_2d(dst + b * C::kBlock, &kv_map, bar, b * 64, row);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wg = tid / 128, wg_tid = tid % 128, warp_in_wg = wg_tid / 32;
  const int g = lane / 4, t4 = lane % 4;
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar + 8 * stage);
  };
  float o[128];  // O[64 heads, 256 wg + 8n + 2 t4 + {0, 1}]: o[4n], o[4n + 1] row g; o[4n + 2], o[4n + 3] row g + 8
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  uint32_t pa[C::kSteps][4];  // P as the A fragments of P V's 16-key steps
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // warpgroup 0: running max (exp2 domain), sums
  // O[:, 256 wg ..] += P V over the tile in `stage` (V: the rows' first 512 values, 4 column blocks per half).
  auto issue_pv = [&](int stage) {
    const Sw128Desc<C::kBlock, 1024> dv(kv_s + stage * C::kTile + wg * 4 * C::kBlock);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kSteps; ++kk) wgmma_rs_n256_tb<T>(o, pa[kk], dv.at(kk * 16 * 128));
    wgmma_commit();
  };
  auto rescale = [&](const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[4 * n + 0] *= alpha[0];
        o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1];
        o[4 * n + 3] *= alpha[1];
      }
    }
  };

  if (wg == 0) {
    // Q: 64 rows x 72 chunks into the swizzled tile; rows past num_heads are zeros.
    const T* q = static_cast<const T*>(p.q) + int64_t(seq) * p.q_stride_seq;
#pragma unroll 4
    for (int i = wg_tid; i < kMlaWgRows * kMlaChunks; i += 128) {
      const int row = i / kMlaChunks, ch = i % kMlaChunks;
      const bool valid = head0 + row < p.num_heads;
      cp_async_16(q_s + sw128_offset<kMlaWgRows>(row, ch),
                  q + int64_t(valid ? head0 + row : 0) * p.q_stride_head + ch * 8, valid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    named_sync(kMlaWgBarOwn, 128);

    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % kStages;
      mbar_wait(full_bar + 8 * stage, uint32_t((tile / kStages) & 1));
      float s[kKeys / 2];
      // The 36 k-steps' descriptors: one add each from the tile's two bases (see Sw128Desc). q_s passes through an
      // empty asm so that the compiler recomputes Q's 36 per tile instead of holding them across the loop.
      uint32_t q_at = q_s;
      asm volatile("" : "+r"(q_at));
      const Sw128Desc<16, 1024> dq(q_at), dk(kv_s + stage * C::kTile);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMlaWidth / 16; ++kk) {
        const uint64_t da = dq.at((kk / 4) * (kMlaWgRows * 128) + (kk % 4) * 32);
        const uint64_t db = dk.at((kk / 4) * C::kBlock + (kk % 4) * 32);
        if constexpr (kKeys == 64) {
          wgmma_ss_n64<T>(s, da, db, kk > 0 ? 1 : 0);
        } else {
          wgmma_ss_n32<T>(s, da, db, kk > 0 ? 1 : 0);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();  // S_t, and the previous tile's P V issued before it
      fence_regs(s);
      fence_regs(o);
      fence_regs(pa);
      if (tile > 0) release((tile - 1) % kStages);

      const int n0 = key_begin + tile * kKeys;
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float part[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = n0 + 8 * n + 2 * t4 + e;
            float& v = s[4 * n + 2 * r + e];
            v = key < key_end ? v * p.scale_log2 : -INFINITY;
            part[n % 2] = fmaxf(part[n % 2], v);
          }
        float mx = fmaxf(part[0], part[1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[r], mx);  // finite: the tile has a valid key
        alpha[r] = exp2f(m_run[r] - m_new);
        m_run[r] = m_new;
        float sums[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = s[4 * n + 2 * r + e];
            v = exp2f(v - m_new);
            sums[n % 2] += v;
          }
        l_run[r] = l_run[r] * alpha[r] + (sums[0] + sums[1]);
      }
#pragma unroll
      for (int kk = 0; kk < C::kSteps; ++kk) {
        pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
      }
      // The partition's last tile: rows at or past key_end hold what the cache holds beyond the sequence, or nothing
      // copied this time; their P is 0, but 0 x NaN is NaN. Zero their 512 values before either P V reads them.
      if (key_end - n0 < kKeys) {
        unsigned char* vz = smem_raw + (kv_s + stage * C::kTile - raw_addr);
        const int first = key_end - n0;
        for (int i = wg_tid; i < (kKeys - first) * 64; i += 128) {  // 8 blocks x 8 chunks per row
          const int r = first + i / 64, b = (i / 8) % 8, c = i % 8;
          *reinterpret_cast<uint4*>(vz + b * C::kBlock + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async_shared();
        named_sync(kMlaWgBarOwn, 128);
      }
      if (tile > 0) named_sync(kMlaWgBarPTaken, 256);  // warpgroup 1 holds the previous P in its registers
#pragma unroll
      for (int kk = 0; kk < C::kSteps; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) sP[(4 * kk + j) * 128 + wg_tid] = pa[kk][j];
      sP[(4 * C::kSteps) * 128 + wg_tid] = __float_as_uint(alpha[0]);
      sP[(4 * C::kSteps + 1) * 128 + wg_tid] = __float_as_uint(alpha[1]);
      named_arrive(kMlaWgBarPReady, 256);
      rescale(alpha);
      issue_pv(stage);  // runs while the next tile's S is issued
    }
    wgmma_wait<0>();
    fence_regs(o);
    release((num_tiles - 1) % kStages);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    named_sync(kMlaWgBarPTaken, 256);  // warpgroup 1 has taken the last P: its words can carry the statistics
    sP[wg_tid] = __float_as_uint(m_run[0]);
    sP[128 + wg_tid] = __float_as_uint(m_run[1]);
    sP[256 + wg_tid] = __float_as_uint(l_run[0]);
    sP[384 + wg_tid] = __float_as_uint(l_run[1]);
    named_arrive(kMlaWgBarStats, 256);
  } else {
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % kStages;
      named_sync(kMlaWgBarPReady, 256);
      float alpha[2];
#pragma unroll
      for (int kk = 0; kk < C::kSteps; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) pa[kk][j] = sP[(4 * kk + j) * 128 + wg_tid];
      alpha[0] = __uint_as_float(sP[(4 * C::kSteps) * 128 + wg_tid]);
      alpha[1] = __uint_as_float(sP[(4 * C::kSteps + 1) * 128 + wg_tid]);
      named_arrive(kMlaWgBarPTaken, 256);
      mbar_wait(full_bar + 8 * stage, uint32_t((tile / kStages) & 1));  // the copies' bytes, seen by this side
      rescale(alpha);
      issue_pv(stage);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(stage);
    }
    named_sync(kMlaWgBarStats, 256);
    m_run[0] = __uint_as_float(sP[wg_tid]);
    m_run[1] = __uint_as_float(sP[128 + wg_tid]);
    l_run[0] = __uint_as_float(sP[256 + wg_tid]);
    l_run[1] = __uint_as_float(sP[384 + wg_tid]);
  }

  // Normalise and store this warpgroup's 256 columns (o as 32 n-tiles of 8 columns).
  store_mla_output<T, 32>(p, reinterpret_cast<const float(&)[32][4]>(o), m_run, l_run, seq, split,
                          head0 + warp_in_wg * 16 + g, wg * 256, t4, wg == 0 && t4 == 0);
#else
  __trap();  // not launched: the host picks this kernel only when the binary holds sm_90a code for the device
#endif
}

// A 2-D tensor map over the latent cache's rows ([num_blocks * block_size, 576], 16-bit), boxes of `box_rows` rows x
// 64 values, 128-byte swizzled; false when the driver or the layout does not allow one.
inline bool encode_latent_map(CUtensorMap& map, const void* base, DType dt, int64_t rows, int box_rows) {
  const EncodeTiled fn = encode_tiled();
  if (!fn || reinterpret_cast<uintptr_t>(base) % 16 != 0 || rows > INT32_MAX) return false;
  const cuuint64_t dims[2] = {cuuint64_t(kMlaWidth), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kMlaWidth) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUtensorMapDataType type = dt == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Any width, rank and float dtype: one block per (head, sequence), 128 threads over the row's values (up to
// kGenericMaxWidth), one block-wide dot product per key, online softmax in fp32.
constexpr int kGenericThreads = 128, kGenericPerThread = 8, kGenericMaxWidth = kGenericThreads * kGenericPerThread;

template <class T>
__global__ void __launch_bounds__(kGenericThreads) mla_decode_generic_kernel(MlaDecodeParams p) {
  __shared__ float s_part[kGenericThreads / 32];
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int seq_len = p.seq_lens[seq];
  const T* q = static_cast<const T*>(p.q) + int64_t(seq) * p.q_stride_seq + int64_t(head) * p.q_stride_head;
  float qv[kGenericPerThread], acc[kGenericPerThread];
#pragma unroll
  for (int i = 0; i < kGenericPerThread; ++i) {
    const int d = tid + i * kGenericThreads;
    qv[i] = d < p.width ? float(q[d]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const T* cache = static_cast<const T*>(p.kv_cache);
  const int32_t* table = p.block_tables + int64_t(seq) * p.block_table_stride;
  for (int key = 0; key < seq_len; ++key) {
    const T* row = cache + (int64_t(table[key / p.block_size]) * p.block_size + key % p.block_size) * p.width;
    float part = 0.f;
#pragma unroll
    for (int i = 0; i < kGenericPerThread; ++i) {
      const int d = tid + i * kGenericThreads;
      if (d < p.width) part += qv[i] * float(row[d]);
    }
    for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
    if (tid % 32 == 0) s_part[tid / 32] = part;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < kGenericThreads / 32; ++w) s += s_part[w];
    __syncthreads();
    s *= p.scale_log2;
    const float m_new = fmaxf(m, s), corr = exp2f(m - m_new), w = exp2f(s - m_new);
    l = l * corr + w;
    m = m_new;
#pragma unroll
    for (int i = 0; i < kGenericPerThread; ++i) {
      const int d = tid + i * kGenericThreads;
      acc[i] = acc[i] * corr + (d < p.rank ? w * float(row[d]) : 0.f);
    }
  }
  T* out = static_cast<T*>(p.out) + (int64_t(seq) * p.num_heads + head) * p.rank;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int i = 0; i < kGenericPerThread; ++i) {
    const int d = tid + i * kGenericThreads;
    if (d < p.rank) out[d] = T(acc[i] * inv);
  }
}

// Merges the splits of one (head, sequence): out = sum_s w_s o_s / sum_s w_s, w_s = sum_s 2^(max_s - max), over the
// splits that held keys. grid = (num_heads, num_seqs).
constexpr int kReduceThreads = 128, kMaxSplits = 64;

template <class T>
__global__ void __launch_bounds__(kReduceThreads) mla_decode_reduce_kernel(MlaDecodeParams p) {
  __shared__ float weights[kMaxSplits];
  const int head = blockIdx.x, seq = blockIdx.y;
  const int seq_len = p.seq_lens[seq];
  const int splits = seq_len > 0 ? min((seq_len + p.partition_keys - 1) / p.partition_keys, p.num_splits) : 0;
  const int64_t row0 = (int64_t(seq) * p.num_heads + head) * p.num_splits;
  const float* max_sum = p.partial_max_sum + 2 * row0;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, max_sum[2 * s]);
  for (int s = threadIdx.x; s < splits; s += kReduceThreads)
    weights[s] = max_sum[2 * s + 1] * exp2f(max_sum[2 * s] - mx);
  __syncthreads();
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += weights[s];
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* out = static_cast<T*>(p.out) + (int64_t(seq) * p.num_heads + head) * p.rank;
  for (int d = threadIdx.x; d < p.rank; d += kReduceThreads) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += weights[s] * p.partial_out[(row0 + s) * p.rank + d];
    out[d] = T(acc * inv);
  }
}

// Splits per sequence: enough blocks to fill the SMs once (one block per SM: the kernel takes ~165 KiB of shared
// memory), never partitions shorter than kMinPartition keys (each split costs a Q load and a 32 KiB fp32 partial
// written and read back, ~5% of a 1024-key partition's latent bytes), never more than kMaxSplits.
constexpr int kMinPartition = 256, kPartitionAlign = kMlaKeys;  // partitions are whole tiles

std::pair<int, int> choose_mla_splits(int64_t max_seq_len, int64_t blocks_per_split, int num_sms, int blocks_per_sm) {
  const int64_t slots = int64_t(num_sms) * std::max(blocks_per_sm, 1);
  const int64_t useful = std::max<int64_t>(1, (max_seq_len + kMinPartition - 1) / kMinPartition);
  int64_t splits =
      std::clamp<int64_t>(slots / std::max<int64_t>(blocks_per_split, 1), 1, std::min<int64_t>(useful, kMaxSplits));
  int64_t partition = (std::max<int64_t>(max_seq_len, 1) + splits - 1) / splits;
  partition = (partition + kPartitionAlign - 1) / kPartitionAlign * kPartitionAlign;
  splits = std::max<int64_t>(1, (max_seq_len + partition - 1) / partition);
  return {int(splits), int(partition)};
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

MlaDecode::MlaDecode(int64_t num_heads, int64_t kv_lora_rank, int64_t rope_dim, double scale)
    : num_heads_(num_heads), kv_lora_rank_(kv_lora_rank), rope_dim_(rope_dim), scale_(scale) {
  KBN_CHECK(num_heads > 0, "MlaDecode: argument 'num_heads' must be positive, got ", num_heads);
  KBN_CHECK(kv_lora_rank > 0, "MlaDecode: argument 'kv_lora_rank' must be positive, got ", kv_lora_rank);
  KBN_CHECK(rope_dim >= 0, "MlaDecode: argument 'rope_dim' must be >= 0, got ", rope_dim);
  KBN_CHECK(std::isfinite(scale) && scale > 0, "MlaDecode: argument 'scale' must be finite and positive, got ", scale);
}

Tensor MlaDecode::forward(const Tensor& q, const Tensor& kv_cache, const Tensor& seq_lens, const Tensor& block_tables,
                          int64_t max_seq_len) {
  constexpr const char* op = "mla_decode";
  const int64_t W = kv_lora_rank_ + rope_dim_, L = kv_lora_rank_;
  check_rank(q, op, "q", 3, "[num_seqs, num_heads, kv_lora_rank + rope_dim]");
  check_size(q, op, "q", 1, num_heads_, "num_heads");
  check_size(q, op, "q", 2, W, "kv_lora_rank + rope_dim");
  check_dtype(q, op, "q", {DType::f32, DType::f16, DType::bf16});
  check_rank(kv_cache, op, "kv_cache", 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]");
  check_size(kv_cache, op, "kv_cache", 2, W, "kv_lora_rank + rope_dim");
  check_same_dtype(q, kv_cache, op, "q", "kv_cache");
  check_contiguous(kv_cache, op, "kv_cache");
  const int64_t B = q.size(0);
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_size(seq_lens, op, "seq_lens", 0, B, "num_seqs = q.size(0)");
  check_dtype(seq_lens, op, "seq_lens", {DType::i32});
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  check_size(block_tables, op, "block_tables", 0, B, "num_seqs = q.size(0)");
  check_dtype(block_tables, op, "block_tables", {DType::i32});
  for (const auto* t : {&kv_cache, &seq_lens, &block_tables})
    check_same_device(q, *t, op, "q", t == &kv_cache ? "kv_cache" : t == &seq_lens ? "seq_lens" : "block_tables");
  check_last_dim_contiguous(q, op, "q");
  KBN_CHECK(max_seq_len >= 0, op, ": argument 'max_seq_len' must be >= 0, got ", max_seq_len);
  KBN_CHECK(kv_cache.size(1) > 0, op, ": argument 'kv_cache' ", kv_cache.str(), " has block_size 0");
  Tensor out = Tensor::empty({B, num_heads_, L}, q.dtype(), q.device());
  if (q.is_cpu()) {
    reference::mla_decode(out, q, kv_cache, seq_lens, block_tables, scale_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (B == 0) return out;
  check_contiguous(seq_lens, op, "seq_lens");
  check_last_dim_contiguous(block_tables, op, "block_tables");
  KBN_CHECK(B <= 65535, op, ": at most 65535 sequences per launch, got ", B);
  MlaDecodeParams p{};
  p.q = q.data_ptr();
  p.kv_cache = kv_cache.data_ptr();
  p.out = out.data_ptr();
  p.seq_lens = seq_lens.data<int32_t>();
  p.block_tables = block_tables.data<int32_t>();
  p.q_stride_seq = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.block_table_stride = block_tables.stride(0);
  p.num_heads = int(num_heads_);
  p.block_size = int(kv_cache.size(1));
  p.width = int(W);
  p.rank = int(L);
  p.scale_log2 = float(scale_ * 1.4426950408889634);
  const Stream stream = current_stream();
  const bool mma = q.dtype() != DType::f32 && W == kMlaWidth && L == kMlaRank && q.stride(0) % 8 == 0 &&
                   q.stride(1) % 8 == 0 && reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(kv_cache.data_ptr()) % 16 == 0;
  if (!mma) {
    KBN_CHECK(W <= kGenericMaxWidth, op, ": latent width ", W, " exceeds the generic kernel's ", kGenericMaxWidth);
    KBN_CHECK(num_heads_ <= 65535, op, ": at most 65535 heads, got ", num_heads_);
    dispatch_float16_32(q.dtype(), op, "q", [&](auto t) {
      mla_decode_generic_kernel<decltype(t)>
          <<<dim3(unsigned(num_heads_), unsigned(B)), kGenericThreads, 0, stream>>>(p);
      KBN_CUDA_CHECK_LAUNCH();
    });
    return out;
  }
  dispatch_float16(q.dtype(), op, "q", [&](auto t) {
    using T = decltype(t);
    // Hopper (this binary holding sm_90 code for the device): 64 heads or more on the warpgroup-MMA kernel where the
    // pages allow its tensor map, else the bulk-copy kernel; other GPUs the cp.async one.
    auto* bulk = mla_decode_bulk_kernel<T>;
    const int device = q.device().index;
    const bool hopper = runs_sm90_image(reinterpret_cast<const void*>(bulk), device);
    const int64_t bs = kv_cache.size(1);
    CUtensorMap map{};
    auto* wg_kernel = mla_decode_wgmma_kernel<T, kMlaWgKeys, kMlaWgStages>;
    const bool wgmma = hopper && num_heads_ >= kMlaWgRows &&
                       runs_sm90_image(reinterpret_cast<const void*>(wg_kernel), device) &&
                       ((bs >= 8 && kMlaWgKeys % bs == 0) || bs % kMlaWgKeys == 0) &&
                       encode_latent_map(map, kv_cache.data_ptr(), q.dtype(), kv_cache.size(0) * bs,
                                         int(std::min<int64_t>(bs, kMlaWgKeys)));
    const void* kernel = wgmma   ? reinterpret_cast<const void*>(wg_kernel)
                         : hopper ? reinterpret_cast<const void*>(bulk)
                                  : reinterpret_cast<const void*>(mla_decode_mma_kernel<T>);
    const size_t smem = wgmma ? MlaWg::kSmem : hopper ? kMlaBulkSmem : kMlaSmem;
    const int threads = wgmma ? kMlaWgThreads : hopper ? kMlaBulkThreads : kMlaThreads;
    const int rows = wgmma ? kMlaWgRows : kMlaRows;
    const KernelLaunchFacts& facts = kernel_launch_facts(kernel, device, threads, smem);
    const int64_t head_groups = (num_heads_ + rows - 1) / rows;
    const auto [num_splits, partition] =
        choose_mla_splits(max_seq_len, B * head_groups, facts.num_sms, facts.blocks_per_sm);
    p.num_splits = num_splits;
    p.partition_keys = partition;
    Tensor partial_out, partial_max_sum;  // fp32 workspace from the caching allocator, ordered on this stream
    if (num_splits > 1) {
      partial_out = Tensor::empty({B, num_heads_, num_splits, L}, DType::f32, q.device());
      partial_max_sum = Tensor::empty({B, num_heads_, num_splits, 2}, DType::f32, q.device());
      p.partial_out = partial_out.data<float>();
      p.partial_max_sum = partial_max_sum.data<float>();
    }
    const dim3 grid{unsigned(num_splits), unsigned(head_groups), unsigned(B)};
    if (wgmma) {
      wg_kernel<<<grid, threads, smem, stream>>>(p, map);
    } else if (hopper) {
      bulk<<<grid, threads, smem, stream>>>(p);
    } else {
      mla_decode_mma_kernel<T><<<grid, threads, smem, stream>>>(p);
    }
    KBN_CUDA_CHECK_LAUNCH();
    if (num_splits > 1) {
      mla_decode_reduce_kernel<T><<<dim3(unsigned(num_heads_), unsigned(B)), kReduceThreads, 0, stream>>>(p);
      KBN_CUDA_CHECK_LAUNCH();
    }
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
