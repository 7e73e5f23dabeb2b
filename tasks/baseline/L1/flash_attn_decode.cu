#include "L1/flash_attn_decode.h"

#include <cmath>
#include <utility>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "L1/attention_generic.cuh"
#include "L1/attention_mma.cuh"
#include "L1/mbarrier.cuh"
#include "L1/tma.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, element strides, a params struct, a stream ----

struct DecodeParams {
  const void* q;            // [num_seqs, num_heads, head_size], last dim contiguous
  const void* key_cache;    // [num_blocks, block_size, num_kv_heads, head_size], last dim contiguous
  const void* value_cache;  // [num_blocks, block_size, num_kv_heads, head_size], last dim contiguous
  void* out;                // [num_seqs, num_heads, head_size]; written by the split kernel when num_splits == 1
  float* partial_out;       // [num_seqs, num_heads, num_splits, head_size]: each split's normalised output
  float* partial_max_sum;   // [num_seqs, num_heads, num_splits, 2]: each split's (max in the exp2 domain, sum)
  const int* seq_lens;      // [num_seqs]
  const int* block_tables;  // [num_seqs, max_blocks_per_seq] row stride block_table_stride
  int64_t q_stride_seq, q_stride_head;
  int64_t out_stride_seq, out_stride_head;
  int64_t k_stride_block, k_stride_slot, k_stride_head;
  int64_t v_stride_block, v_stride_slot, v_stride_head;
  int64_t block_table_stride;
  int block_size;
  int block_shift;  // log2(block_size) when it is a power of two, else -1 (then key -> page divides); Hopper only
  int group_size;   // query heads per kv head
  int head_chunks;  // ceil(group_size / kRows): blocks per kv head along the query heads
  int num_heads;
  int num_splits;      // key partitions per sequence (grid.y of the Hopper kernel, grid.x of the mma kernel)
  int partition_keys;  // keys per partition, a multiple of 64 (kPartitionQuantum, kTileKeys)
  float scale_log2;    // softmax scale * log2(e): scores live in the exp2 domain
  AttnFeatures feat;   // sliding window, soft cap, sinks (attention_mma.cuh)
};

// The first key the sequence's new token (position seq_len - 1) sees: 0, or the start of its sliding window. The
// partitions cover [seq_first_key, seq_len): keys before the window are never read.
__device__ __forceinline__ int seq_first_key(const DecodeParams& p, int seq_len) {
  return max(window_first_key(p.feat, seq_len - 1), 0);
}

// The query heads and keys one block of either split kernel owns.
struct DecodeBlock {
  int kv_head;
  int head_begin;  // first query head of the block
  int num_rows;    // query heads of the block (<= kRows)
  int key_begin, key_end;  // the partition's keys, [key_begin, key_end)
};

// Block `head_block` of the grid's head axis (kv head, then chunks of kRows query heads), partition `split` of
// sequence `seq`: fills `b` and returns true, or returns false for a block past its sequence's keys, after
// writing the zero output of a sequence with no keys at all (the reduce does the same when the work is split).
template <class T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ bool decode_block(const DecodeParams& p, unsigned head_block, int split, int seq,
                                             DecodeBlock& b) {
  b.kv_head = head_block / p.head_chunks;
  const int row_begin = (head_block % p.head_chunks) * kRows;  // first query head of the group in this block
  b.head_begin = b.kv_head * p.group_size + row_begin;
  b.num_rows = min(kRows, p.group_size - row_begin);
  const int seq_len = p.seq_lens[seq];
  b.key_begin = seq_first_key(p, seq_len) + split * p.partition_keys;
  if (b.key_begin >= seq_len) {
    if (seq_len <= 0 && split == 0 && p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + seq * p.out_stride_seq;
      for (int i = threadIdx.x; i < b.num_rows * kHeadDim; i += kThreads)
        out[(b.head_begin + i / kHeadDim) * p.out_stride_head + i % kHeadDim] = from_f32<T>(0.f);
    }
    return false;
  }
  b.key_end = min(b.key_begin + p.partition_keys, seq_len);
  return true;
}

// Both split kernels write the same partial_out / partial_max_sum layouts and share the reduce kernel below.
constexpr int kMaxSplits = 64;
constexpr int kReduceThreads = 128;

// Merges the splits of one (sequence, query head): out = sum_s w_s o_s / sum_s w_s, w_s = sum_s * 2^(max_s - max).
// grid = (num_heads, num_seqs); block = kReduceThreads.
template <class T>
__global__ void __launch_bounds__(kReduceThreads) flash_attn_decode_reduce_kernel(DecodeParams p, int head_size) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  __shared__ float weights[kMaxSplits];
  const int head = blockIdx.x, seq = blockIdx.y;
  const int seq_len = p.seq_lens[seq];
  const int splits = seq_len > 0 ? min(ceil_div(seq_len - seq_first_key(p, seq_len), p.partition_keys), p.num_splits) : 0;
  const int64_t row0 = (int64_t(seq) * p.num_heads + head) * p.num_splits;
  const float* max_sum = p.partial_max_sum + row0 * 2;

  float max = -INFINITY;
  for (int s = 0; s < splits; ++s) max = fmaxf(max, max_sum[2 * s]);
  for (int s = threadIdx.x; s < splits; s += kReduceThreads)
    weights[s] = max_sum[2 * s + 1] * exp2f(max_sum[2 * s] - max);
  __syncthreads();
  float total = sink_term(p.feat, head, max);
  for (int s = 0; s < splits; ++s) total += weights[s];
  const float inv_total = total > 0.f ? p.feat.v_scale / total : 0.f;

  const float* partial = p.partial_out + row0 * head_size;
  T* out = static_cast<T*>(p.out) + seq * p.out_stride_seq + head * p.out_stride_head;
  for (int d = threadIdx.x; d < head_size; d += kReduceThreads) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += weights[s] * partial[int64_t(s) * head_size + d];
    out[d] = from_f32<T>(acc * inv_total);
  }
}

namespace mma_path {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;               // query heads per block: the M of one mma (unused rows are zeros)
constexpr int kTileKeys = kWarps * 16;  // keys per shared-memory tile: 16 per warp (the K of one mma)
constexpr int kStages = 3;              // K/V tiles in flight per block
constexpr int kMinPartitionKeys = 256;

// The kernel for GPUs other than Hopper (sm_80 and later): Hopper runs hopper_path's kernel below.
// Split-KV decode (flash-decoding) on tensor cores. grid = (num_splits, num_kv_heads * head_chunks, num_seqs);
// block = kThreads. A block takes up to kRows query heads that share one kv head (the GQA group, padded to the 16
// rows of an mma with zeros) and the keys [split * partition_keys, +partition_keys) of one sequence, so every K/V
// byte of the partition is read from HBM once for the whole group. K/V tiles of kTileKeys keys stream through a
// kStages-deep cp.async ring (16-byte copies, zero-filled past the last key); warp w takes keys 16w..16w+15 of
// each tile: S = Q K^T (16 x 16), online softmax, O += P V, all in registers. The four warps' states are merged
// through shared memory at the end, and the block writes either the final output (num_splits == 1) or the
// split's (max, sum, normalised output) for flash_attn_decode_reduce_kernel.
//
// NOTE: the kernel is memory bound by design (the tensor cores run 16-row mmas of which only `group` rows are
// real); what matters is bytes in flight: kStages - 1 tiles of 2 * kTileKeys * head_size * 2 bytes per block
// (64 KiB at head_size 128, two blocks per SM), which covers HBM3e latency x bandwidth per SM several times.
// Next gains: a power-of-two block_size specialisation of the key -> page arithmetic and one page lookup per
// row (as in the Hopper kernel; its bulk copies need sm_90), and folding the reduce into the last finishing split
// block (saves one launch at small batch).
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) flash_attn_decode_split_kernel(DecodeParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kTileElems = kTileKeys * kHeadDim;
  static_assert(kTileKeys * kChunks % kThreads == 0 && kRows * kChunks % kThreads == 0, "whole copy rounds");

  extern __shared__ __align__(16) unsigned char smem[];
  T* q_smem = reinterpret_cast<T*>(smem);     // [kRows, kHeadDim]
  T* k_smem = q_smem + kRows * kHeadDim;      // [kStages, kTileKeys, kHeadDim]
  T* v_smem = k_smem + kStages * kTileElems;  // [kStages, kTileKeys, kHeadDim]

  const int split = blockIdx.x;
  const int seq = blockIdx.z;
  const int tid = threadIdx.x;
  DecodeBlock blk;
  if (!decode_block<T, kHeadDim, kRows, kThreads>(p, blockIdx.y, split, seq, blk)) return;
  const int kv_head = blk.kv_head, head_begin = blk.head_begin, num_rows = blk.num_rows;
  const int key_begin = blk.key_begin, key_end = blk.key_end;
  const int num_tiles = ceil_div(key_end - key_begin, kTileKeys);
  const bool soft_cap = p.feat.cap_in > 0.f;
  const float score_scale = soft_cap ? 1.f : p.scale_log2;  // soft-capped scores are in the exp2 domain already

  const int warp = tid / 32;
  const int lane = tid % 32;

  const T* q = static_cast<const T*>(p.q) + seq * p.q_stride_seq;
  const T* k_head = static_cast<const T*>(p.key_cache) + kv_head * p.k_stride_head;
  const T* v_head = static_cast<const T*>(p.value_cache) + kv_head * p.v_stride_head;
  const int* block_table = p.block_tables + int64_t(seq) * p.block_table_stride;

  // Q rows of the block's heads; padding rows are zero-filled.
#pragma unroll
  for (int j = 0; j < kRows * kChunks / kThreads; ++j) {
    const int i = tid + j * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < num_rows;
    const T* src = valid ? q + (head_begin + r) * p.q_stride_head + c * 8 : q;
    cp_async_16(smem_addr(q_smem + swizzle<kHeadDim>(r, c)), src, valid);
  }

  // K and V tile `tile` of the partition into stage `stage`; keys at or past key_end are zero-filled.
  auto load_kv = [&](int tile, int stage) {
    T* ks = k_smem + stage * kTileElems;
    T* vs = v_smem + stage * kTileElems;
    const int n0 = key_begin + tile * kTileKeys;
#pragma unroll
    for (int j = 0; j < kTileKeys * kChunks / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i / kChunks, c = i % kChunks;
      const int key = n0 + r;
      const bool valid = key < key_end;
      const T* k_src = k_head;
      const T* v_src = v_head;
      if (valid) {
        const int64_t block = block_table[key / p.block_size];
        const int64_t slot = key % p.block_size;
        k_src = k_head + block * p.k_stride_block + slot * p.k_stride_slot + c * 8;
        v_src = v_head + block * p.v_stride_block + slot * p.v_stride_slot + c * 8;
      }
      const int dst = swizzle<kHeadDim>(r, c);
      cp_async_16(smem_addr(ks + dst), k_src, valid);
      cp_async_16(smem_addr(vs + dst), v_src, valid);
    }
  };

  // Prologue: kStages - 1 commit groups (the first also holds Q); empty groups keep the count uniform.
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < num_tiles) load_kv(stage, stage);
    cp_async_commit();
  }

  const int g = lane / 4, t4 = lane % 4;
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, exp2 domain
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sums; reduced over the quad at the end

  // ldmatrix lane addressing (see ldmatrix_x4): A of Q rows, B of K rows (non-transposed), B of V rows (transposed).
  const int a_row = lane % 16, a_chunk = lane / 16;
  const int k_row = warp * 16 + lane % 8 + (lane / 16) * 8, k_chunk = (lane / 8) % 2;
  const int v_row = warp * 16 + lane % 8 + ((lane / 8) % 2) * 8, v_chunk = lane / 16;

  for (int tile = 0; tile < num_tiles; ++tile) {
    // Groups committed so far: kStages - 1 + tile; allowing kStages - 2 pending means tile's group has landed.
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile's K/V (and Q) visible to all warps; the stage read in the previous tile is free
    const int next = tile + kStages - 1;
    if (next < num_tiles) load_kv(next, next % kStages);
    cp_async_commit();

    const T* ks = k_smem + (tile % kStages) * kTileElems;
    const T* vs = v_smem + (tile % kStages) * kTileElems;

    // S = Q K^T for this warp's 16 keys, as 2 n-tiles of 8 keys.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4], b[4];
      ldmatrix_x4(a, smem_addr(q_smem + swizzle<kHeadDim>(a_row, 2 * kk + a_chunk)));
      ldmatrix_x4(b, smem_addr(ks + swizzle<kHeadDim>(k_row, 2 * kk + k_chunk)));
      mma_16816<T>(s[0], a, b[0], b[1]);
      mma_16816<T>(s[1], a, b[2], b[3]);
    }

    if (soft_cap) soft_cap_scores<8>(&s[0][0], p.feat);
    const int warp_key0 = key_begin + tile * kTileKeys + warp * 16;
    if (warp_key0 + 16 > key_end) {  // the partition ends inside this warp's keys
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (warp_key0 + n * 8 + 2 * t4 + (e & 1) >= key_end) s[n][e] = -INFINITY;
        }
      }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max * score_scale);
      // A warp whose keys are all past key_end keeps max -inf; subtracting 0 keeps every exponent at 0.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
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

    // O += P V: the two S n-tiles are exactly the A fragment of the warp's 16 keys.
    uint32_t a[4];
    a[0] = pack2<T>(s[0][0], s[0][1]);
    a[1] = pack2<T>(s[0][2], s[0][3]);
    a[2] = pack2<T>(s[1][0], s[1][1]);
    a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < kHeadDim / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_addr(vs + swizzle<kHeadDim>(v_row, 2 * dp + v_chunk)));
      mma_16816<T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }

  // Merge the warps: every copy has landed and every warp is done with the ring, which now holds
  // warp_out [kWarps, kRows, kHeadDim] and warp_max_sum [kWarps, kRows, 2] in fp32.
  cp_async_wait<0>();
  __syncthreads();
  float* warp_out = reinterpret_cast<float*>(k_smem);
  float* warp_max_sum = warp_out + kWarps * kRows * kHeadDim;
  static_assert(
      (kWarps * kRows * kHeadDim + kWarps * kRows * 2) * sizeof(float) <= 2 * kStages * kTileElems * sizeof(T),
      "the warp merge fits in the K/V ring");
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (t4 == 0) {
      warp_max_sum[(warp * kRows + row) * 2] = row_max[r];
      warp_max_sum[(warp * kRows + row) * 2 + 1] = sum;
    }
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<float2*>(warp_out + (warp * kRows + row) * kHeadDim + n * 8 + 2 * t4) =
          make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
  }
  __syncthreads();

  const int64_t partial_row0 = (int64_t(seq) * p.num_heads + head_begin) * p.num_splits + split;
  for (int i = tid; i < num_rows * kHeadDim; i += kThreads) {
    const int row = i / kHeadDim, d = i % kHeadDim;
    // Warp 0 always sees key_begin, so the merged maximum is finite.
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_max_sum[(w * kRows + row) * 2]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(warp_max_sum[(w * kRows + row) * 2] - max);
      sum += weight * warp_max_sum[(w * kRows + row) * 2 + 1];
      acc += weight * warp_out[(w * kRows + row) * kHeadDim + d];
    }
    // One partition: the output is final, so a sink joins its denominator here (else in the reduce).
    const float value = p.num_splits == 1 ? acc / (sum + sink_term(p.feat, head_begin + row, max)) : acc / sum;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out);
      out[seq * p.out_stride_seq + (head_begin + row) * p.out_stride_head + d] = from_f32<T>(value * p.feat.v_scale);
    } else {
      const int64_t partial_row = partial_row0 + int64_t(row) * p.num_splits;
      p.partial_out[partial_row * kHeadDim + d] = value;
      if (d == 0) {
        p.partial_max_sum[partial_row * 2] = max;
        p.partial_max_sum[partial_row * 2 + 1] = sum;
      }
    }
  }
}

// How many key partitions: enough blocks for about two full waves of the GPU (so a straggler costs at most half a
// wave), never partitions shorter than kMinPartitionKeys (each split pays a Q load, a merge and partial writes),
// never more than kMaxSplits. Returns {num_splits, partition_keys}.
std::pair<int, int> choose_splits(int64_t max_seq_len, int64_t blocks_per_split, int num_sms, int blocks_per_sm) {
  const int64_t target_blocks = 2 * int64_t(num_sms) * std::max(blocks_per_sm, 1);
  const int64_t useful = std::max<int64_t>(1, (max_seq_len + kMinPartitionKeys - 1) / kMinPartitionKeys);
  int64_t splits = (target_blocks + blocks_per_split - 1) / blocks_per_split;
  splits = std::clamp<int64_t>(splits, 1, std::min<int64_t>(useful, kMaxSplits));
  int64_t partition = (max_seq_len + splits - 1) / splits;
  partition = (partition + kTileKeys - 1) / kTileKeys * kTileKeys;
  splits = (max_seq_len + partition - 1) / partition;
  return {int(std::max<int64_t>(splits, 1)), int(partition)};
}

template <class T, int kHeadDim>
void launch_flash_attn_decode(DecodeParams p, Device device, int64_t num_seqs, int64_t num_kv_heads,
                              int64_t max_seq_len, Stream stream) {
  p.head_chunks = (p.group_size + kRows - 1) / kRows;
  const size_t smem = size_t(kRows + 2 * kStages * kTileKeys) * kHeadDim * sizeof(T);
  auto* kernel = flash_attn_decode_split_kernel<T, kHeadDim>;
  const KernelLaunchFacts& facts =
      kernel_launch_facts(reinterpret_cast<const void*>(kernel), device.index, kThreads, smem);
  const int num_sms = facts.num_sms, blocks_per_sm = facts.blocks_per_sm;

  const int64_t blocks_per_split = num_seqs * num_kv_heads * p.head_chunks;
  const auto [num_splits, partition_keys] = choose_splits(max_seq_len, blocks_per_split, num_sms, blocks_per_sm);
  p.num_splits = num_splits;
  p.partition_keys = partition_keys;
  Tensor partial_out, partial_max_sum;
  if (num_splits > 1) {
    // NOTE: fp32 workspace from the caching allocator, ordered on this stream (graph-capture safe).
    partial_out = Tensor::empty({num_seqs, p.num_heads, num_splits, kHeadDim}, DType::f32, device);
    partial_max_sum = Tensor::empty({num_seqs, p.num_heads, num_splits, 2}, DType::f32, device);
    p.partial_out = partial_out.data<float>();
    p.partial_max_sum = partial_max_sum.data<float>();
  }
  const dim3 grid{unsigned(num_splits), unsigned(num_kv_heads * p.head_chunks), unsigned(num_seqs)};
  launch_pdl(kernel, grid, kThreads, smem, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
  if (num_splits > 1) {
    const dim3 reduce_grid{unsigned(p.num_heads), unsigned(num_seqs)};
    launch_pdl(flash_attn_decode_reduce_kernel<T>, reduce_grid, kReduceThreads, 0, stream, p, kHeadDim);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mma_path

namespace hopper_path {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpKeys = 16;                          // keys per warp tile: the K of one P V mma
constexpr int kPartitionQuantum = kWarps * kWarpKeys;  // partitions are whole rounds of the four warps
constexpr int kMinPartitionKeys = 64;
constexpr int kMaxDynamicSmemBytes = 227 * 1024 - 1024;  // sm_90's per-block opt-in, less the static barriers / sums

// Shared-memory geometry of the split kernel. kNT n-tiles of 8 query heads (1: group <= 8, 2: up to 16); pages of
// kPageBytes per value (2: the query's 16-bit type; 1: fp8 e4m3).
// Every warp owns a private ring of kStages tiles; a tile holds the warp's 16 K rows then its 16 V rows as copied from
// the pages. The ldmatrix / mma code reads 16-bit tiles whose rows are padded by 16 bytes so that the eight rows an
// ldmatrix phase reads fall in eight different bank groups (the bulk copies cannot swizzle): for 16-bit pages the
// ring's stages themselves; for fp8 pages a per-warp staging tile of that layout, into which the warp widens each
// stage to f16 once it has landed (kConvert; the ring's fp8 rows are dense, see the conversion in the kernel).
template <int kHeadDim, int kNT, int kPageBytes>
struct DecodeConfig {
  static_assert(kPageBytes == 1 || kPageBytes == 2, "16-bit or fp8 e4m3 pages");
  static constexpr int kRows = 8 * kNT;  // query heads per block
  static constexpr bool kConvert = kPageBytes == 1;
  // Tiles in each warp's ring (bytes in flight: kStages - 1 to kStages tiles of 2 * 16 rows per warp; HBM latency x
  // the per-SM share of bandwidth is a few tens of KiB). Head 64: 4 x 4.5 KiB per warp, 72 KiB per block, three
  // blocks per SM, ~160-220 KiB in flight per SM. Head 128: 3 x 8.5 KiB, 102 KiB per block, two blocks per SM,
  // ~140-200 KiB per SM. Head 256: a tile is 16.5 KiB, so one block (four warps) per SM whatever the depth (two
  // would need 2 x 132 KiB at two stages); three stages (198 KiB per block, under the 227 KiB opt-in) keep 2-3 tiles,
  // 32-48 KiB, in flight per warp and ~130-200 KiB per SM, as at head 128, where two stages (the same occupancy)
  // would keep only 64-128 KiB; four would need 264 KiB.
  // fp8 pages: a tile is half the bytes (2, 4, 8 KiB at heads 64, 128, 256, rows unpadded), each warp adds a 16-bit
  // staging tile (4.5, 8.5, 16.5 KiB), and a stage is refilled as soon as it is widened, before the tile's math, so
  // kStages tiles are in flight for most of a tile. Depths for about the 16-bit kernel's bytes in flight per SM, at
  // an SM's 228 KiB (each block also takes its static barriers / sums and 1 KiB reserved):
  //   head 64:  7 x 2 + 4.5 = 18.5 KiB per warp, 74 KiB per block, three blocks per SM (8 stages: 82 KiB, two),
  //             12 warps x 12-14 KiB = 144-168 KiB in flight per SM;
  //   head 128: 4 x 4 + 8.5 = 24.5 KiB per warp, 98 KiB per block, two blocks per SM (5 stages: 114 KiB, one),
  //             8 warps x 12-16 KiB = 96-128 KiB per SM;
  //   head 256: 4 x 8 + 16.5 = 48.5 KiB per warp, 194 KiB per block (202.25 with the 16-row Q copy), one block per
  //             SM as at 16 bits (5 stages: 226 KiB, over the opt-in with the Q copy), 4 warps x 24-32 KiB =
  //             96-128 KiB per SM.
  static constexpr int kStages = kPageBytes == 2 ? (kHeadDim == 64 ? 4 : 3) : (kHeadDim == 64 ? 7 : 4);
  static constexpr int kRowBytes = kHeadDim * kPageBytes;  // a page row, as copied
  static constexpr int kPitch = kHeadDim * 2 + 16;         // a row of the 16-bit tiles ldmatrix reads
  static constexpr int kRingPitch = kConvert ? kRowBytes : kPitch;
  static constexpr int kStageBytes = 2 * kWarpKeys * kRingPitch;
  static constexpr int kWarpRingBytes = kStages * kStageBytes;
  static constexpr int kStagingBytes = kConvert ? 2 * kWarpKeys * kPitch : 0;
  static constexpr int kWarpBytes = kWarpRingBytes + kStagingBytes;  // a warp's ring, then its staging tile
  // Q's A fragments (kHeadDim / 16 x 4 registers per lane) stay in registers for the whole partition, except where
  // O^T's accumulator (kHeadDim / 16 * kNT * 4 floats) is over 64 floats, i.e. head 256 with 9-16 query heads: its
  // 128 accumulators plus 64 Q registers spilled past the 255-register cap (ptxas, sm_90a: 255 registers, 20 bytes
  // of spill stores), so Q is read there from a block-wide [kRows][kPitch] copy after the warps' rings, one more
  // ldmatrix per 16 dims per tile (212 registers, no spill; shared-memory bandwidth is not what bounds this kernel).
  static constexpr bool kQInSmem = kHeadDim / 16 * kNT * 4 > 64;
  static constexpr int kQBytes = kQInSmem ? kRows * kPitch : 0;
  static constexpr int kSmemBytes = kWarps * kWarpBytes + kQBytes;
  static_assert(kSmemBytes <= kMaxDynamicSmemBytes, "the warps' rings fit in one block's shared memory");
  static constexpr uint32_t kTxBytes = 2 * kWarpKeys * kRowBytes;  // bytes one tile's 32 bulk copies deliver
  // How a tile is copied. Rows of 256 bytes or more (heads 128 and 256 at 16 bits, head 256 in fp8): one
  // cp.async.bulk per row (lane), completion counted in bytes on the stage's mbarrier (one arrival: lane 0's
  // arrive.expect_tx). Shorter rows: the bulk engine's per-copy cost caps an SM at ~55% of HBM bandwidth with
  // 128-byte copies (first version measured), so the warp copies the tile with 16-byte cp.async instead, kChunks
  // lanes per row, kRowsPerPass rows per instruction, and every lane's cp.async.mbarrier.arrive.noinc is one of the
  // stage barrier's 32 arrivals.
  static constexpr bool kBulkRows = kRowBytes >= 256;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // read by the kernel body only
  static constexpr uint32_t kBarArrivals = kBulkRows ? 1 : 32;
#endif
  static constexpr int kChunks = kRowBytes / 16;                    // 16-byte chunks per row
  static constexpr int kRowsPerPass = kBulkRows ? 1 : 32 / kChunks;  // rows one warp-wide cp.async covers
  static constexpr int kKeyPasses = kWarpKeys / kRowsPerPass;       // passes over the K rows (as many for V)
  static_assert(kBulkRows || (32 % kChunks == 0 && kKeyPasses * kRowsPerPass == kWarpKeys), "whole cp.async passes");
  static_assert(kTxBytes == 2u * kWarpKeys * kChunks * 16, "a tile is 2 * kWarpKeys rows of kChunks chunks");
  // The fp8 widening: one 16-byte chunk (16 values) per lane per pass, 32 / kChunks rows per pass, kChunks passes.
  static_assert(!kConvert || (kChunks % 4 == 0 && 32 % kChunks == 0), "whole conversion passes of chunk quads");
  static constexpr int kMergePitch = kHeadDim + 4;                 // floats; conflict-free fragment stores
  static_assert(kRows * kMergePitch * sizeof(float) <= kWarpBytes, "a warp's merge rows fit in its own ring");
};

// ---- sm_90 bulk-copy helpers (cp.async.bulk: global -> shared, completion counted in bytes; barriers: mbarrier.cuh) ----
// sm_90 PTX, compiled only with the kernel body below that calls them (the sm_90 / sm_90a device pass).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// 16-byte cp.async (L2 only), and an arrival on `bar` once all of this thread's earlier cp.async are complete,
// counted against the barrier's init count (.noinc).
__device__ __forceinline__ void cp_async_16_g2s(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Four e4m3 values (the bytes of `v`, lowest first) as f16 pairs: lo = {0, 1}, hi = {2, 3}, the lower index in the
// lower half as in every 16-bit fragment. Exact: every e4m3 value (|x| <= 448, subnormals down to 2^-9) is an f16
// normal or zero, and NaN stays NaN.
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t v, uint32_t& lo, uint32_t& hi) {
  asm("{\n"
      ".reg .b16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(v));
}

// Two query values of type T (one 4-byte word) as the tensor cores' input type M: unchanged, or bf16 rounded to f16
// (to nearest, saturated to +-65504; NaN stays NaN) for the f16 mma of fp8 pages.
template <class T, class M>
__device__ __forceinline__ uint32_t mma_word(uint32_t w) {
  if constexpr (std::is_same_v<T, M>) {
    return w;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16> && std::is_same_v<M, __half>, "bf16 q, f16 mma");
    uint32_t d;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n"
        : "=r"(d)
        : "f"(__uint_as_float(w & 0xffff0000u)), "f"(__uint_as_float(w << 16)));
    return d;
  }
}
#endif  // __CUDA_ARCH__ >= 900

// The kernel for Hopper (sm_90 / sm_90a images); other GPUs run mma_path's kernel above.
// Split-KV decode (flash-decoding) on tensor cores. grid = (num_kv_heads * head_chunks, num_splits, num_seqs);
// block = kThreads. A block takes up to kRows query heads that share one kv head (the GQA group) and the keys
// [split * partition_keys, +partition_keys) of one sequence, so every K/V byte of the partition is read from HBM
// once for the whole group. The partition is cut in 16-key warp tiles dealt round robin to the four warps; each
// warp streams its own tiles through a private kStages-deep ring completed on a per-(warp, stage) mbarrier, so the
// warps never wait for each other until the final merge. At heads 128 and 256 the ring is fed by cp.async.bulk (one
// 256- or 512-byte row per lane: lanes 0-15 K rows, 16-31 V rows; completion counted in bytes); at head 64 by 16-byte
// cp.async (8 per lane per tile, 8 lanes per 128-byte row) whose per-lane cp.async.mbarrier.arrive.noinc are the
// barrier's 32 arrivals (DecodeConfig::kBulkRows says which).
//   S  = Q K^T      (A = Q from registers, rows = heads g / g + 8; B = K via ldmatrix): S[head][key]
//   O^T += V^T P^T  (A = V^T via ldmatrix.trans, B = P^T, which is exactly S's C fragment of rows g, packed)
// Keeping O transposed makes its accumulator kHeadDim / 16 * kNT * 4 floats (32 at head 128 with group <= 8, half
// of an O[16 heads][128] layout whose rows 8-15 would be padding) and halves the P V mmas. At head 256 that is 64
// floats (group <= 8) or 128 (group <= 16, where Q moves to shared memory: DecodeConfig::kQInSmem).
// Rows past the last key are copies of the last valid key's row (finite data); their scores are masked to -inf,
// so their probabilities are exactly 0 and multiply finite values, as with the zero fill of the mma_path kernel.
// KV is the pages' type: T, or __nv_fp8_e4m3 (--kv-cache-dtype fp8_e4m3, scale 1.0), whose tiles are half the bytes
// (decode is memory bound: that is the point of fp8 pages). Their rows take the same feed rule by bytes (head 256's
// 256-byte rows by bulk copies, heads 64 and 128 by cp.async). Once a stage has landed the warp widens its 32 rows
// to f16 (cvt.rn.f16x2.e4m3x2, exact) into its staging tile, laid out as a 16-bit stage, and refills the stage at
// once; the S and O^T code below then reads the staging tile unchanged. The mmas run in f16 whatever T is (sm_90
// converts e4m3 to f16 only, and P keeps 11 bits): Q is rounded to f16 when loaded (exact for bf16 values in f16's
// normal range; saturated at +-65504), P is packed as f16, the accumulators stay fp32 and the output is T. Other
// GPUs (mma_path) read fp8 pages with the generic kernel.
//
// NOTE: the kernel is memory bound by design; what matters is bytes in flight per SM and few issue slots per
// byte. The mma_path kernel spent ~16 cp.async + a key / block_size division + a 64-bit address per 16 bytes per
// thread and a __syncthreads per tile, with 188 registers; here the page lookup is done once per row (shift/mask
// when block_size is a power of two) and prefetched one tile ahead, and there is no block barrier in the loop.
// At head 128: one bulk copy per row, 3 stages x 8.5 KiB per warp, 102 KiB per block, two blocks (8 warps) per
// SM, i.e. 2-3 tiles (17-26 KiB) in flight per warp and ~140-200 KiB per SM, several times HBM latency x the
// per-SM share of bandwidth. At head 64: 4 stages x 4.5 KiB, 72 KiB per block, three blocks per SM. At head 256
// (Gemma-3): one 512-byte bulk copy per row, 3 stages x 16.5 KiB per warp, 198 KiB per block, one block (4 warps)
// per SM, 2-3 tiles (32-48 KiB) in flight per warp, ~130-200 KiB per SM (DecodeConfig::kStages says why three).
// The first version (bulk copies at both head sizes, split costs counted in keys whatever the head size) was
// measured on the H200 (cold, vs the mma_path kernel): head 128 / group 4 at 1.00-1.40x (73-97% of the
// 4250 GB/s copy bandwidth from B=8 ctx 4096 up; B=1 ctx 8192 and B=8 ctx 1024 even), but head 64 with groups
// 3, 5, 6 at 0.75-0.99x, capped at ~55% of the copy bandwidth whatever the grid (1 to 16 splits, 1 to 6 waves):
// 128-byte bulk copies are bounded by the bulk engine's per-copy cost, not by bytes in flight. Hence the
// cp.async feed at head 64 (the mma_path kernel's 16-byte cp.async reached ~76% there, the bulk path ~97% at
// head 128). This version, measured on the H200 the same way (bench/results/h200/tune_flash_attn_decode.md):
// B=64 ctx 4096 at 90.7% of the copy bandwidth (1.19x; the issue's target is 85%), B=64 ctx 8192 94.1%, B=256
// 97%; head 64 at 0.92-1.10x; geometric mean over the 21 shapes 1.105x. Still short: B=1 (22-33% of the copy
// bandwidth at 4k-8k keys: one sequence cannot fill the SMs' bytes in flight) and small head-64 grids at 1k keys.
// The number of splits comes from a small cost model of whole waves over the SMs (choose_splits), in bytes
// rather than keys so that head 64's fixed costs weigh double; large batches get one split per (sequence, kv
// head) and skip the reduce launch when the blocks balance over the SMs.
template <class T, class KV, int kHeadDim, int kNT>
__global__ void __launch_bounds__(kThreads) flash_attn_decode_split_kernel(DecodeParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = DecodeConfig<kHeadDim, kNT, int(sizeof(KV))>;
  using M = std::conditional_t<Cfg::kConvert, __half, T>;  // the mmas' input type
  constexpr int kRows = Cfg::kRows;
  constexpr int kStages = Cfg::kStages;
  constexpr int kPitch = Cfg::kPitch;
  constexpr int kRingPitch = Cfg::kRingPitch;
  constexpr int kDimTiles = kHeadDim / 16;

  // [kWarps][kStages tiles of K rows then V rows of kRingPitch bytes, staging tile][Q copy (Cfg::kQInSmem)]
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kWarps * kStages];
  __shared__ float warp_max_sum[kWarps][kRows][2];

  const int split = blockIdx.y;
  const int seq = blockIdx.z;
  const int tid = threadIdx.x;
  DecodeBlock blk;
  if (!decode_block<T, kHeadDim, kRows, kThreads>(p, blockIdx.x, split, seq, blk)) return;
  const int kv_head = blk.kv_head, head_begin = blk.head_begin, num_rows = blk.num_rows;
  const int key_begin = blk.key_begin, key_end = blk.key_end;
  const int num_tiles = ceil_div(key_end - key_begin, kWarpKeys);
  const bool soft_cap = p.feat.cap_in > 0.f;
  const float score_scale = soft_cap ? 1.f : p.scale_log2;  // soft-capped scores are in the exp2 domain already

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int my_tiles = warp < num_tiles ? (num_tiles - 1 - warp) / kWarps + 1 : 0;  // tiles warp, warp + 4, ...

  if (tid < kWarps * kStages) {
    mbar_init(smem_addr(&bars[tid]), Cfg::kBarArrivals);  // lane 0's arrive.expect_tx, or every lane's cp.async
    mbar_fence_init();
  }
  __syncthreads();

  // This lane's bulk copy: row `copy_row` of the K (lanes 0-15) or V (lanes 16-31) half of each warp tile.
  const bool copies_v = lane >= kWarpKeys;
  const int copy_row = lane % kWarpKeys;
  const KV* copy_base = copies_v ? static_cast<const KV*>(p.value_cache) + kv_head * p.v_stride_head
                                 : static_cast<const KV*>(p.key_cache) + kv_head * p.k_stride_head;
  const int64_t copy_stride_block = copies_v ? p.v_stride_block : p.k_stride_block;
  const int64_t copy_stride_slot = copies_v ? p.v_stride_slot : p.k_stride_slot;
  const uint32_t ring = smem_addr(smem) + warp * Cfg::kWarpBytes;
  const uint32_t copy_dst = ring + (copies_v ? kWarpKeys * kRingPitch : 0) + copy_row * kRingPitch;
  const uint32_t bar0 = smem_addr(&bars[warp * kStages]);
  const int* block_table = p.block_tables + int64_t(seq) * p.block_table_stride;
  const int block_shift = p.block_shift;

  // The key this lane copies for local tile i, clamped to the last valid key (rows past it are masked).
  auto tile_key = [&](int i) {
    return min(key_begin + (warp + i * kWarps) * kWarpKeys + copy_row, key_end - 1);
  };
  auto lookup_block = [&](int i) {
    const int key = tile_key(i);
    return __ldg(block_table + (block_shift >= 0 ? key >> block_shift : key / p.block_size));
  };
  // `block` is the page of this lane's key row (copy_row); the cp.async path fetches other rows' from their lanes.
  auto issue = [&](int i, int block) {
    const int stage = i % kStages;
    const uint32_t bar = bar0 + stage * 8;
    if constexpr (Cfg::kBulkRows) {
      const int key = tile_key(i);
      const int slot = block_shift >= 0 ? key & (p.block_size - 1) : key % p.block_size;
      const KV* src = copy_base + int64_t(block) * copy_stride_block + int64_t(slot) * copy_stride_slot;
      if (lane == 0) mbar_arrive_expect_tx(bar, Cfg::kTxBytes);
      __syncwarp();
      bulk_copy_g2s(copy_dst + stage * Cfg::kStageBytes, src, Cfg::kRowBytes, bar);
    } else {
      // Pass j: lanes cover chunk lane % kChunks of key rows j * kRowsPerPass + lane / kChunks, K then V.
      constexpr int kChunkValues = 16 / int(sizeof(KV));
      const int chunk = lane % Cfg::kChunks;
      const uint32_t dst = ring + stage * Cfg::kStageBytes + chunk * 16;
      const KV* k_base = static_cast<const KV*>(p.key_cache) + kv_head * p.k_stride_head + chunk * kChunkValues;
      const KV* v_base = static_cast<const KV*>(p.value_cache) + kv_head * p.v_stride_head + chunk * kChunkValues;
      const int tile_key0 = key_begin + (warp + i * kWarps) * kWarpKeys;
#pragma unroll
      for (int j = 0; j < Cfg::kKeyPasses; ++j) {
        const int row = j * Cfg::kRowsPerPass + lane / Cfg::kChunks;
        const int row_block = __shfl_sync(0xffffffffu, block, row);  // lane `row` looked up key row `row`
        const int key = min(tile_key0 + row, key_end - 1);
        const int slot = block_shift >= 0 ? key & (p.block_size - 1) : key % p.block_size;
        cp_async_16_g2s(dst + row * kRingPitch,
                        k_base + int64_t(row_block) * p.k_stride_block + int64_t(slot) * p.k_stride_slot);
        cp_async_16_g2s(dst + (kWarpKeys + row) * kRingPitch,
                        v_base + int64_t(row_block) * p.v_stride_block + int64_t(slot) * p.v_stride_slot);
      }
      cp_async_mbar_arrive_noinc(bar);
    }
  };

  // Prologue: fill the warp's ring (my_tiles is warp-uniform); the block-table reads go out together first.
  int first_blocks[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) first_blocks[i] = i < my_tiles ? lookup_block(i) : 0;
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (i < my_tiles) issue(i, first_blocks[i]);
  }

  const int g = lane / 4, t4 = lane % 4;

  // Q as the A fragments of S = Q K^T, in registers for the whole partition: qa[kk] = {(g, 2t), (g + 8, 2t),
  // (g, 2t + 8), (g + 8, 2t + 8)} + 16 kk. Rows past the block's heads (all of rows 8-15 when kNT == 1) are zero.
  // With Cfg::kQInSmem the block copies Q to shared memory instead (rows past its heads zero) and the S loop reads
  // the same fragments with ldmatrix; 4-byte loads, as the register path, so a q row needs only 4-byte alignment.
  // Either way Q is held as M (rounded to f16 for fp8 pages with bf16 q: mma_word).
  uint32_t qa[Cfg::kQInSmem ? 1 : kDimTiles][4];  // unused with Cfg::kQInSmem
  const T* q = static_cast<const T*>(p.q) + seq * p.q_stride_seq;
  if constexpr (Cfg::kQInSmem) {
    constexpr int kWords = kHeadDim / 2;  // 4-byte words per row
    for (int i = tid; i < kRows * kWords; i += kThreads) {
      const int row = i / kWords, word = i % kWords;
      const unsigned int v =
          row < num_rows ? mma_word<T, M>(__ldg(
                               reinterpret_cast<const unsigned int*>(q + (head_begin + row) * p.q_stride_head) + word))
                         : 0u;
      reinterpret_cast<unsigned int*>(smem + kWarps * Cfg::kWarpBytes + row * kPitch)[word] = v;
    }
    __syncthreads();  // Q visible to every warp; the rings' copies are already in flight
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      const bool valid = r < kNT && row < num_rows;
      const T* q_row = q + (head_begin + (valid ? row : 0)) * p.q_stride_head + 2 * t4;
#pragma unroll
      for (int kk = 0; kk < kDimTiles; ++kk) {
        qa[kk][r] = valid ? mma_word<T, M>(__ldg(reinterpret_cast<const unsigned int*>(q_row + 16 * kk))) : 0u;
        qa[kk][r + 2] = valid ? mma_word<T, M>(__ldg(reinterpret_cast<const unsigned int*>(q_row + 16 * kk + 8))) : 0u;
      }
    }
  }

  // O^T accumulators: o[m][nt] = {(dim 16m + g, head 8nt + 2t), (.., 2t + 1), (dim 16m + g + 8, 2t), (.., 2t + 1)}.
  float o[kDimTiles][kNT][4];
#pragma unroll
  for (int m = 0; m < kDimTiles; ++m) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.f;
  }
  float row_max[kNT], row_sum[kNT];  // rows g + 8r, exp2 domain; sums are this lane's partials (quad-reduced later)
#pragma unroll
  for (int r = 0; r < kNT; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }

  // ldmatrix lane addressing, the same for K (non-transposed: B of S) and V (transposed: A of O^T): matrix
  // lane / 8 covers keys 8 (lane / 16) .. +7 and 16-byte chunk (lane / 8) % 2 of each 16-dim slice.
  const uint32_t ld_off = (lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 16;
  // Q's (Cfg::kQInSmem): the A operand's, matrix lane / 8 covering rows 8 ((lane / 8) % 2) .. +7, chunk lane / 16.
  const uint32_t q_ld = smem_addr(smem) + kWarps * Cfg::kWarpBytes + (lane % 16) * kPitch + (lane / 16) * 16;

  for (int i = 0; i < my_tiles; ++i) {
    const int stage = i % kStages;
    const bool refill = i + kStages < my_tiles;
    int next_block = 0;
    if (refill) next_block = lookup_block(i + kStages);  // issued early: its latency hides under this tile's math
    mbar_wait(bar0 + stage * 8, uint32_t(i / kStages) & 1u);
    if constexpr (Cfg::kConvert) {
      // Lane -> (row, chunk) of the widening, chunk = 16 fp8 values (16 bytes in, 32 out): pass j covers the
      // 32 / kChunks rows from j * 32 / kChunks. An 8-lane phase of a 16-byte access (lane / 8) takes four chunks of
      // each of two neighbour rows (h = (lane / 4) % 2): with 8 or 16 chunks per row, quad a ^ h of row h (a: the
      // phase's quad of the pair), with 4 the row's only quad. Then a phase's eight ring reads fall in eight bank
      // groups (dense fp8 rows: group 4 h + i at 4 chunks a row, 4 (a ^ h) + i at 8 or 16, i = lane % 4), and so do
      // its eight 16-byte staging writes of each of the two stores (row r, 16-bit chunk 2 c or 2 c + 1: group r + 2 i
      // or r + 2 i + 1 mod 8, the two rows of opposite parity).
      constexpr int kQuads = Cfg::kChunks / 4;
      const int h = (lane / 4) % 2;
      const int row = 2 * ((lane / 8) / kQuads) + h;
      const int chunk = 4 * (kQuads > 1 ? ((lane / 8) % kQuads) ^ h : 0) + lane % 4;
      unsigned char* const warp_smem = smem + warp * Cfg::kWarpBytes;
      const unsigned char* src = warp_smem + stage * Cfg::kStageBytes + row * kRingPitch + chunk * 16;
      unsigned char* dst = warp_smem + Cfg::kWarpRingBytes + row * kPitch + chunk * 32;
      __syncwarp();  // every lane's ldmatrix reads of the previous tile's staging are done
#pragma unroll
      for (int j = 0; j < Cfg::kChunks; ++j) {
        const int rows = j * (32 / Cfg::kChunks);
        const uint4 v = *reinterpret_cast<const uint4*>(src + rows * kRingPitch);
        uint4 lo, hi;
        e4m3x4_to_f16x4(v.x, lo.x, lo.y);
        e4m3x4_to_f16x4(v.y, lo.z, lo.w);
        e4m3x4_to_f16x4(v.z, hi.x, hi.y);
        e4m3x4_to_f16x4(v.w, hi.z, hi.w);
        uint4* out = reinterpret_cast<uint4*>(dst + rows * kPitch);
        out[0] = lo;
        out[1] = hi;
      }
      // The staging tile is complete for every lane's ldmatrix, and the stage's bytes are consumed: refill it now,
      // before the math, so that all kStages tiles are in flight meanwhile (the fence orders the generic reads
      // before the bulk copies' async-proxy writes; harmless for cp.async).
      __syncwarp();
      if (refill) {
        fence_proxy_async_shared();
        issue(i + kStages, next_block);
      }
    }
    // fp8 pages: the warp's staging tile, after its ring.
    const uint32_t ks = ring + (Cfg::kConvert ? Cfg::kWarpRingBytes : stage * Cfg::kStageBytes) + ld_off;
    const uint32_t vs = ks + kWarpKeys * kPitch;

    // S = Q K^T for the warp's 16 keys (2 n-tiles of 8 keys), as two independent mma chains (even / odd kk).
    float sc[2][2][4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int n = 0; n < 2; ++n) sc[c][n][0] = sc[c][n][1] = sc[c][n][2] = sc[c][n][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kDimTiles; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + kk * 32);
      if constexpr (Cfg::kQInSmem) {
        uint32_t a[4];
        ldmatrix_x4(a, q_ld + kk * 32);
        mma_16816<M>(sc[kk % 2][0], a, b[0], b[1]);
        mma_16816<M>(sc[kk % 2][1], a, b[2], b[3]);
      } else {
        mma_16816<M>(sc[kk % 2][0], qa[kk], b[0], b[1]);
        mma_16816<M>(sc[kk % 2][1], qa[kk], b[2], b[3]);
      }
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = sc[0][n][e] + sc[1][n][e];
    }

    if (soft_cap) soft_cap_scores<8>(&s[0][0], p.feat);
    const int key0 = key_begin + (warp + i * kWarps) * kWarpKeys;
    if (key0 + kWarpKeys > key_end) {  // the partition ends inside this tile
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (key0 + n * 8 + 2 * t4 + (e & 1) >= key_end) s[n][e] = -INFINITY;
        }
      }
    }

    float alpha[kNT];
#pragma unroll
    for (int r = 0; r < kNT; ++r) {
      float tile_max = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max * score_scale);
      // Key 0 of every tile is valid, so new_max is finite for real data; the guard keeps -inf - -inf out anyway.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      alpha[r] = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][2 * r] = exp2f(fmaf(s[n][2 * r], score_scale, -base));
        s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], score_scale, -base));
        tile_sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha[r] + tile_sum;
    }

    // Rescale O^T: its columns are heads 8nt + 2t and 2t + 1, whose alphas live in lanes 4 (2t) and 4 (2t + 1).
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float alpha_lo = __shfl_sync(0xffffffffu, alpha[nt], 8 * t4);
      const float alpha_hi = __shfl_sync(0xffffffffu, alpha[nt], 8 * t4 + 4);
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m) {
        o[m][nt][0] *= alpha_lo;
        o[m][nt][1] *= alpha_hi;
        o[m][nt][2] *= alpha_lo;
        o[m][nt][3] *= alpha_hi;
      }
    }

    // O^T += V^T P^T. B = P^T (keys 2t..2t+1 / 2t+8..2t+9, head g) = S rows g (+8 for n-tile 1), packed.
    uint32_t pb[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      pb[nt][0] = pack2<M>(s[0][2 * nt], s[0][2 * nt + 1]);
      pb[nt][1] = pack2<M>(s[1][2 * nt], s[1][2 * nt + 1]);
    }
#pragma unroll
    for (int m = 0; m < kDimTiles; ++m) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vs + m * 32);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_16816<M>(o[m][nt], a, pb[nt][0], pb[nt][1]);
    }

    if (!Cfg::kConvert && refill) {
      // Every lane's ldmatrix reads of this stage are done (and ordered before the async proxy, which the bulk
      // copies write through; harmless for cp.async) before the barrier is re-armed and the lanes overwrite it.
      __syncwarp();
      fence_proxy_async_shared();
      issue(i + kStages, next_block);
    }
  }

  // Merge the warps. Every copy a warp issued has been waited on, so each warp can reuse its own ring (and staging
  // tile) for its O^T (as [kRows][kMergePitch] fp32, bank-conflict free) without waiting for the others.
  __syncwarp();
  float* warp_out = reinterpret_cast<float*>(smem + warp * Cfg::kWarpBytes);
#pragma unroll
  for (int r = 0; r < kNT; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (t4 == 0) {
      warp_max_sum[warp][g + 8 * r][0] = row_max[r];
      warp_max_sum[warp][g + 8 * r][1] = sum;
    }
  }
#pragma unroll
  for (int m = 0; m < kDimTiles; ++m) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float* w = warp_out + (nt * 8 + 2 * t4) * Cfg::kMergePitch + 16 * m + g;
      w[0] = o[m][nt][0];
      w[Cfg::kMergePitch] = o[m][nt][1];
      w[8] = o[m][nt][2];
      w[Cfg::kMergePitch + 8] = o[m][nt][3];
    }
  }
  __syncthreads();

  const int64_t partial_row0 = (int64_t(seq) * p.num_heads + head_begin) * p.num_splits + split;
  for (int i = tid; i < num_rows * kHeadDim; i += kThreads) {
    const int row = i / kHeadDim, d = i % kHeadDim;
    // Warp 0 always has key_begin, so the merged maximum is finite.
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_max_sum[w][row][0]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(warp_max_sum[w][row][0] - max);
      const float* wo = reinterpret_cast<const float*>(smem + w * Cfg::kWarpBytes);
      sum += weight * warp_max_sum[w][row][1];
      acc += weight * wo[row * Cfg::kMergePitch + d];
    }
    // One partition: the output is final, so a sink joins its denominator here (else in the reduce).
    const float value = p.num_splits == 1 ? acc / (sum + sink_term(p.feat, head_begin + row, max)) : acc / sum;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out);
      out[seq * p.out_stride_seq + (head_begin + row) * p.out_stride_head + d] = from_f32<T>(value * p.feat.v_scale);
    } else {
      const int64_t partial_row = partial_row0 + int64_t(row) * p.num_splits;
      p.partial_out[partial_row * kHeadDim + d] = value;
      if (d == 0) {
        p.partial_max_sum[partial_row * 2] = max;
        p.partial_max_sum[partial_row * 2 + 1] = sum;
      }
    }
  }
#else
  __trap();  // not launched: the host picks this kernel only when the binary holds sm_90 code for the device
#endif
}

// How many key partitions, from a small cost model of an SM's time: the blocks spread over the SMs (the kernel
// is memory bound, so an SM's time is the bytes of the blocks it gets, whatever its occupancy), a fixed cost per
// wave of resident blocks (pipeline fill), and a fixed cost for the reduce launch when split. Costs are in units
// of a 16-bit head-128 key (512 bytes of K and V); a key streams key_cost / 128 of that (key_cost: its K and V bytes
// / 4, i.e. head_size for 16-bit pages, head_size / 2 for fp8), so at 16-bit head 64 the fixed costs weigh double
// and at head 256 half (the constants were tuned at 16-bit head 128, whose choices this leaves unchanged).
// Choices whose grid leaves SMs idle are taken only when no split count fills them all. Ties between single-wave
// choices go to more splits (more warps streaming, shorter pipelines). Partitions are whole rounds of the four
// warps and never shorter than kMinPartitionKeys; at most kMaxSplits. Returns {num_splits, partition_keys}.
std::pair<int, int> choose_splits(int64_t max_seq_len, int64_t blocks_per_split, int num_sms, int blocks_per_sm,
                                  int key_cost) {
  constexpr int64_t kWaveCostKeys = 64, kReduceCostKeys = 256, kCostUnitHead = 128;
  const int64_t sms = std::max(num_sms, 1);
  const int64_t slots = sms * std::max(blocks_per_sm, 1);
  const int64_t per_key = std::max(key_cost, 1);  // in 1 / kCostUnitHead of a 16-bit head-128 key
  const int64_t max_splits = std::clamp<int64_t>((max_seq_len + kMinPartitionKeys - 1) / kMinPartitionKeys, 1,
                                                 kMaxSplits);
  for (const bool fill_sms : {true, false}) {
    int64_t best_splits = 0, best_partition = 0, best_cost = -1;
    for (int64_t s = 1; s <= max_splits; ++s) {
      int64_t partition = (max_seq_len + s - 1) / s;
      partition = (partition + kPartitionQuantum - 1) / kPartitionQuantum * kPartitionQuantum;
      const int64_t splits = (max_seq_len + partition - 1) / partition;
      const int64_t blocks = blocks_per_split * splits;
      if (fill_sms && blocks < sms) continue;
      const int64_t waves = (blocks + slots - 1) / slots;
      const int64_t cost = (blocks + sms - 1) / sms * partition * per_key +
                           (waves * kWaveCostKeys + (splits > 1 ? kReduceCostKeys : 0)) * kCostUnitHead;
      if (best_cost < 0 || cost < best_cost || (cost == best_cost && waves == 1)) {
        best_cost = cost;
        best_splits = splits;
        best_partition = partition;
      }
    }
    if (best_cost >= 0) return {int(best_splits), int(best_partition)};
  }
  return {1, int((max_seq_len + kPartitionQuantum - 1) / kPartitionQuantum * kPartitionQuantum)};  // not reached
}

template <class T, class KV, int kHeadDim, int kNT>
void launch_flash_attn_decode_rows(DecodeParams p, Device device, int64_t num_seqs, int64_t num_kv_heads,
                                   int64_t max_seq_len, Stream stream) {
  using Cfg = DecodeConfig<kHeadDim, kNT, int(sizeof(KV))>;
  constexpr size_t smem = Cfg::kSmemBytes;
  p.head_chunks = (p.group_size + Cfg::kRows - 1) / Cfg::kRows;
  auto* kernel = flash_attn_decode_split_kernel<T, KV, kHeadDim, kNT>;
  const KernelLaunchFacts& facts =
      kernel_launch_facts(reinterpret_cast<const void*>(kernel), device.index, kThreads, smem);
  const int num_sms = facts.num_sms, blocks_per_sm = facts.blocks_per_sm;

  const int64_t blocks_per_split = num_seqs * num_kv_heads * p.head_chunks;
  const auto [num_splits, partition_keys] =
      choose_splits(max_seq_len, blocks_per_split, num_sms, blocks_per_sm, kHeadDim * int(sizeof(KV)) / 2);
  p.num_splits = num_splits;
  p.partition_keys = partition_keys;
  Tensor partial_out, partial_max_sum;
  if (num_splits > 1) {
    // NOTE: fp32 workspace from the caching allocator, ordered on this stream (graph-capture safe).
    partial_out = Tensor::empty({num_seqs, p.num_heads, num_splits, kHeadDim}, DType::f32, device);
    partial_max_sum = Tensor::empty({num_seqs, p.num_heads, num_splits, 2}, DType::f32, device);
    p.partial_out = partial_out.data<float>();
    p.partial_max_sum = partial_max_sum.data<float>();
  }
  // The kv heads (and head chunks) of one (sequence, partition) are neighbours in launch order: they read the
  // same pages at about the same time.
  const dim3 grid{unsigned(num_kv_heads * p.head_chunks), unsigned(num_splits), unsigned(num_seqs)};
  launch_pdl(kernel, grid, kThreads, smem, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
  if (num_splits > 1) {
    const dim3 reduce_grid{unsigned(p.num_heads), unsigned(num_seqs)};
    launch_pdl(flash_attn_decode_reduce_kernel<T>, reduce_grid, kReduceThreads, 0, stream, p, kHeadDim);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

// One n-tile of 8 query heads per block when the GQA group fits (every model we serve), else two (16 per block).
template <class T, class KV, int kHeadDim>
void launch_flash_attn_decode(DecodeParams p, Device device, int64_t num_seqs, int64_t num_kv_heads,
                              int64_t max_seq_len, Stream stream) {
  if (p.group_size <= 8)
    launch_flash_attn_decode_rows<T, KV, kHeadDim, 1>(p, device, num_seqs, num_kv_heads, max_seq_len, stream);
  else
    launch_flash_attn_decode_rows<T, KV, kHeadDim, 2>(p, device, num_seqs, num_kv_heads, max_seq_len, stream);
}

}  // namespace hopper_path

// Head 256 (Gemma-3) has a tensor-core decode kernel on Hopper only: mma_path's [16 rows][head_size] accumulator
// would hold 128 fp32 per lane there (it already takes 198 registers at head 128 with 64; hopper_path's transposed
// O^T holds 64 at head 256), so other GPUs keep running head 256 on the generic kernel (decode_tensor_core_supports).
constexpr int kHopperOnlyHeadSize = 256;

// Hopper's kernels or mma_path's, decided once per device: any instantiation of the Hopper kernel tells whether
// the binary's image for the device is an sm_90 one. KV: the pages' type, T or __nv_fp8_e4m3 (Hopper only).
template <class T, class KV, int kHeadDim>
void launch_flash_attn_decode(const DecodeParams& p, Device device, int64_t num_seqs, int64_t num_kv_heads,
                              int64_t max_seq_len, Stream stream) {
  auto* hopper = hopper_path::flash_attn_decode_split_kernel<T, KV, kHeadDim, 1>;
  if (runs_sm90_image(reinterpret_cast<const void*>(hopper), device.index))
    hopper_path::launch_flash_attn_decode<T, KV, kHeadDim>(p, device, num_seqs, num_kv_heads, max_seq_len, stream);
  else if constexpr (kHeadDim == kHopperOnlyHeadSize || !std::is_same_v<KV, T>)  // not reached: the generic kernel ran
    KBN_FAIL("flash_attn_decode: head_size ", kHeadDim, std::is_same_v<KV, T> ? "" : " with fp8 pages",
             " has a tensor-core kernel on Hopper (sm_90) only, not on ", device.str());
  else
    mma_path::launch_flash_attn_decode<T, kHeadDim>(p, device, num_seqs, num_kv_heads, max_seq_len, stream);
}

// True when decode runs (q's dtype, the pages' dtype, head_size) on tensor cores on `device`. Pages of q's dtype: the
// shared set (attention_mma.cuh) on every GPU, plus kHopperOnlyHeadSize when this binary runs Hopper code there (any
// instantiation of the Hopper kernel tells). fp8 e4m3 pages: those head sizes (64, 128, 256) when it runs Hopper code
// there; mma_path has no fp8 feed, so other GPUs read fp8 pages with the generic kernel. Otherwise the generic kernel
// runs. Keep the head sizes in step with dispatch_decode_head_size just below.
bool decode_tensor_core_supports(DType dt, DType pages, int64_t head_size, Device device) {
  const bool fp8 = pages == DType::fp8e4m3;
  if (!fp8 && tensor_core_attention_supports(dt, head_size)) return true;
  if (dt != DType::bf16 && dt != DType::f16) return false;
  if (head_size != kHopperOnlyHeadSize && !(fp8 && tensor_core_attention_supports(dt, head_size))) return false;
  using hopper_path::flash_attn_decode_split_kernel;
  const void* hopper =
      dt == DType::bf16
          ? reinterpret_cast<const void*>(
                flash_attn_decode_split_kernel<__nv_bfloat16, __nv_bfloat16, kHopperOnlyHeadSize, 1>)
          : reinterpret_cast<const void*>(flash_attn_decode_split_kernel<__half, __half, kHopperOnlyHeadSize, 1>);
  return runs_sm90_image(hopper, device.index);
}

template <class F>
void dispatch_decode_head_size(int64_t head_size, const char* op, F&& f) {
  if (head_size == kHopperOnlyHeadSize) return f(std::integral_constant<int, kHopperOnlyHeadSize>{});
  dispatch_head_size(head_size, op, f);
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FlashAttnDecode::FlashAttnDecode(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads,
                                  int64_t sliding_window, double logits_soft_cap)
    : num_heads_(num_heads),
      head_size_(head_size),
      num_kv_heads_(num_kv_heads),
      scale_(scale),
      sliding_window_(sliding_window),
      logits_soft_cap_(logits_soft_cap) {
  KBN_CHECK(num_heads > 0, "FlashAttnDecode: argument 'num_heads' must be positive, got ", num_heads);
  KBN_CHECK(head_size > 0, "FlashAttnDecode: argument 'head_size' must be positive, got ", head_size);
  KBN_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "FlashAttnDecode: argument 'num_kv_heads' (",
            num_kv_heads, ") must be positive and divide 'num_heads' (", num_heads, ")");
  KBN_CHECK(scale > 0, "FlashAttnDecode: argument 'scale' must be positive, got ", scale);
  KBN_CHECK(sliding_window >= 0, "FlashAttnDecode: argument 'sliding_window' must be >= 0 (0: no window), got ",
            sliding_window);
  KBN_CHECK(std::isfinite(logits_soft_cap) && logits_soft_cap >= 0, "FlashAttnDecode: argument 'logits_soft_cap' must be "
            "finite and >= 0 (0: none), got ", logits_soft_cap);
}

Tensor FlashAttnDecode::forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                const Tensor& seq_lens, const Tensor& block_tables, int64_t max_seq_len,
                                const KVScales& scales) {
  return run(q, key_cache, value_cache, seq_lens, block_tables, max_seq_len, nullptr, scales);
}

Tensor FlashAttnDecode::forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                const Tensor& seq_lens, const Tensor& block_tables, int64_t max_seq_len,
                                const Tensor& sinks, const KVScales& scales) {
  return run(q, key_cache, value_cache, seq_lens, block_tables, max_seq_len, &sinks, scales);
}

Tensor FlashAttnDecode::run(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                            const Tensor& seq_lens, const Tensor& block_tables, int64_t max_seq_len,
                            const Tensor* sinks, const KVScales& scales) {
  constexpr const char* op = "flash_attn_decode";
  check_rank(q, op, "q", 3, "[num_seqs, num_heads, head_size]");
  check_size(q, op, "q", 1, num_heads_, "num_heads");
  check_size(q, op, "q", 2, head_size_, "head_size");
  check_dtype(q, op, "q", {DType::f32, DType::f16, DType::bf16});
  for (const auto& [cache, name] : {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}}) {
    check_rank(*cache, op, name, 4, "[num_blocks, block_size, num_kv_heads, head_size]");
    check_size(*cache, op, name, 2, num_kv_heads_, "num_kv_heads");
    check_size(*cache, op, name, 3, head_size_, "head_size");
    // fp8 e4m3 pages (--kv-cache-dtype fp8_e4m3) go with any q: Hopper's tensor-core kernel reads them at heads 64,
    // 128 and 256 with f16 / bf16 q, the generic kernel otherwise (decode_tensor_core_supports), as on CPU the oracle.
    if (cache->dtype() != DType::fp8e4m3) check_same_dtype(*cache, q, op, name, "q");
    check_same_device(*cache, q, op, name, "q");
  }
  KBN_CHECK(value_cache.shape() == key_cache.shape(), op, ": argument 'value_cache' ", value_cache.str(),
            " must have the shape of 'key_cache' ", key_cache.str());
  check_same_dtype(value_cache, key_cache, op, "value_cache", "key_cache");
  KBN_CHECK(key_cache.size(1) > 0, op, ": argument 'key_cache' must have a positive block_size, got ", key_cache.str());
  const int64_t num_seqs = q.size(0);
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  check_size(seq_lens, op, "seq_lens", 0, num_seqs, "num_seqs (q.size(0))");
  check_size(block_tables, op, "block_tables", 0, num_seqs, "num_seqs (q.size(0))");
  for (const auto& [meta, name] : {std::pair{&seq_lens, "seq_lens"}, std::pair{&block_tables, "block_tables"}}) {
    check_dtype(*meta, op, name, {DType::i32});
    check_same_device(*meta, q, op, name, "q");
  }
  if (sinks) {
    reference::check_attention_sinks(op, *sinks, num_heads_);
    check_same_device(*sinks, q, op, "sinks", "q");
  }
  check_kv_scales(op, scales, key_cache.dtype());
  const double scale = scale_ * scales.k;  // fp8 keys read as e * k_scale: the factor joins the softmax scale

  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  if (num_seqs == 0) return out;
  KBN_CHECK(max_seq_len > 0, op, ": argument 'max_seq_len' must be positive when q has sequences, got ", max_seq_len,
            " for ", q.str());

  if (q.is_cpu()) {
    reference::paged_attention_decode(out, q, key_cache, value_cache, seq_lens, block_tables, scale_,
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
  check_contiguous(seq_lens, op, "seq_lens");
  check_last_dim_contiguous(block_tables, op, "block_tables");
  KBN_CHECK(num_seqs <= 65535, op, ": at most 65535 sequences per launch, got ", num_seqs);

  Tensor sinks_f32;  // holds the f32 sinks until the launch is enqueued
  const AttnFeatures feat = attn_features(sliding_window_, logits_soft_cap_, scale, sinks, sinks_f32, scales.v);
  const DType pages = key_cache.dtype();  // q's dtype, or fp8 e4m3
  if (!decode_tensor_core_supports(q.dtype(), pages, head_size_, q.device())) {
    GenericAttnParams g = generic_attention_params(q, key_cache, value_cache, out, nullptr, seq_lens, block_tables,
                                                   num_heads_, num_kv_heads_, head_size_, scale);
    set_generic_features(g, feat, logits_soft_cap_);
    launch_generic_attention(g, q.dtype(), pages, num_seqs, num_heads_, op, current_stream());
    return out;
  }
  DecodeParams p{};
  p.q = q.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.out = out.data_ptr();
  p.seq_lens = seq_lens.data<int32_t>();
  p.block_tables = block_tables.data<int32_t>();
  p.q_stride_seq = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out_stride_seq = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.k_stride_block = key_cache.stride(0);
  p.k_stride_slot = key_cache.stride(1);
  p.k_stride_head = key_cache.stride(2);
  p.v_stride_block = value_cache.stride(0);
  p.v_stride_slot = value_cache.stride(1);
  p.v_stride_head = value_cache.stride(2);
  p.block_table_stride = block_tables.stride(0);
  p.block_size = int(key_cache.size(1));
  p.group_size = int(num_heads_ / num_kv_heads_);
  p.block_shift = (p.block_size & (p.block_size - 1)) == 0 ? std::countr_zero(unsigned(p.block_size)) : -1;
  p.head_chunks = 1;  // set by the launch from the kernel's rows per block
  p.num_heads = int(num_heads_);
  p.scale_log2 = float(scale * 1.4426950408889634);
  p.feat = feat;
  // A window bounds the keys any sequence reads: the partitions are cut over that span, not max_seq_len.
  const int64_t max_keys = sliding_window_ > 0 ? std::min(max_seq_len, sliding_window_) : max_seq_len;
  dispatch_float16(q.dtype(), op, "q", [&](auto t) {
    using T = decltype(t);
    dispatch_decode_head_size(head_size_, op, [&](auto d) {
      constexpr int kHeadDim = decltype(d)::value;
      if (pages == DType::fp8e4m3)
        launch_flash_attn_decode<T, __nv_fp8_e4m3, kHeadDim>(p, q.device(), num_seqs, num_kv_heads_, max_keys,
                                                             current_stream());
      else
        launch_flash_attn_decode<T, T, kHeadDim>(p, q.device(), num_seqs, num_kv_heads_, max_keys, current_stream());
    });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
