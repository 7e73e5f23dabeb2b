#include "L1/flash_attn_decode.h"

#include <utility>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "L1/attention_generic.cuh"
#include "L1/attention_mma.cuh"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
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
  int group_size;   // query heads per kv head
  int head_chunks;  // ceil(group_size / kRows): blocks per kv head along the query heads
  int num_heads;
  int num_splits;      // key partitions per sequence (grid.x)
  int partition_keys;  // keys per partition, a multiple of kTileKeys
  float scale_log2;    // softmax scale * log2(e): scores live in the exp2 domain
};

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;               // query heads per block: the M of one mma (unused rows are zeros)
constexpr int kTileKeys = kWarps * 16;  // keys per shared-memory tile: 16 per warp (the K of one mma)
constexpr int kStages = 3;              // K/V tiles in flight per block
constexpr int kMaxSplits = 64;
constexpr int kMinPartitionKeys = 256;
constexpr int kReduceThreads = 128;

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
// Next gains: TMA bulk copies of whole pages (fewer issue slots than 16-byte cp.async per thread), a
// power-of-two block_size specialisation of the key -> page arithmetic, and folding the reduce into the last
// finishing split block (saves one launch at small batch).
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) flash_attn_decode_split_kernel(DecodeParams p) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kTileElems = kTileKeys * kHeadDim;
  static_assert(kTileKeys * kChunks % kThreads == 0 && kRows * kChunks % kThreads == 0, "whole copy rounds");

  extern __shared__ __align__(16) unsigned char smem[];
  T* q_smem = reinterpret_cast<T*>(smem);     // [kRows, kHeadDim]
  T* k_smem = q_smem + kRows * kHeadDim;      // [kStages, kTileKeys, kHeadDim]
  T* v_smem = k_smem + kStages * kTileElems;  // [kStages, kTileKeys, kHeadDim]

  const int split = blockIdx.x;
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y / p.head_chunks;
  const int row_begin = (blockIdx.y % p.head_chunks) * kRows;  // first query head of the group in this block
  const int head_begin = kv_head * p.group_size + row_begin;
  const int num_rows = min(kRows, p.group_size - row_begin);
  const int seq_len = p.seq_lens[seq];
  const int key_begin = split * p.partition_keys;
  const int tid = threadIdx.x;

  if (key_begin >= seq_len) {
    // Past the sequence's keys. A sequence with no keys at all gets zeros (the reduce does the same when split).
    if (seq_len <= 0 && split == 0 && p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + seq * p.out_stride_seq;
      for (int i = tid; i < num_rows * kHeadDim; i += kThreads)
        out[(head_begin + i / kHeadDim) * p.out_stride_head + i % kHeadDim] = from_f32<T>(0.f);
    }
    return;
  }
  const int key_end = min(key_begin + p.partition_keys, seq_len);
  const int num_tiles = ceil_div(key_end - key_begin, kTileKeys);

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
      const float new_max = fmaxf(row_max[r], tile_max * p.scale_log2);
      // A warp whose keys are all past key_end keeps max -inf; subtracting 0 keeps every exponent at 0.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][2 * r] = exp2f(fmaf(s[n][2 * r], p.scale_log2, -base));
        s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], p.scale_log2, -base));
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
    const float value = acc / sum;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out);
      out[seq * p.out_stride_seq + (head_begin + row) * p.out_stride_head + d] = from_f32<T>(value);
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

// Merges the splits of one (sequence, query head): out = sum_s w_s o_s / sum_s w_s, w_s = sum_s * 2^(max_s - max).
// grid = (num_heads, num_seqs); block = kReduceThreads.
template <class T>
__global__ void __launch_bounds__(kReduceThreads) flash_attn_decode_reduce_kernel(DecodeParams p, int head_size) {
  __shared__ float weights[kMaxSplits];
  const int head = blockIdx.x, seq = blockIdx.y;
  const int seq_len = p.seq_lens[seq];
  const int splits = seq_len > 0 ? min(ceil_div(seq_len, p.partition_keys), p.num_splits) : 0;
  const int64_t row0 = (int64_t(seq) * p.num_heads + head) * p.num_splits;
  const float* max_sum = p.partial_max_sum + row0 * 2;

  float max = -INFINITY;
  for (int s = 0; s < splits; ++s) max = fmaxf(max, max_sum[2 * s]);
  for (int s = threadIdx.x; s < splits; s += kReduceThreads)
    weights[s] = max_sum[2 * s + 1] * exp2f(max_sum[2 * s] - max);
  __syncthreads();
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += weights[s];
  const float inv_total = total > 0.f ? 1.f / total : 0.f;

  const float* partial = p.partial_out + row0 * head_size;
  T* out = static_cast<T*>(p.out) + seq * p.out_stride_seq + head * p.out_stride_head;
  for (int d = threadIdx.x; d < head_size; d += kReduceThreads) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += weights[s] * partial[int64_t(s) * head_size + d];
    out[d] = from_f32<T>(acc * inv_total);
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
  kernel<<<grid, kThreads, smem, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
  if (num_splits > 1) {
    const dim3 reduce_grid{unsigned(p.num_heads), unsigned(num_seqs)};
    flash_attn_decode_reduce_kernel<T><<<reduce_grid, kReduceThreads, 0, stream>>>(p, kHeadDim);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

FlashAttnDecode::FlashAttnDecode(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads)
    : num_heads_(num_heads), head_size_(head_size), num_kv_heads_(num_kv_heads), scale_(scale) {
  KBN_CHECK(num_heads > 0, "FlashAttnDecode: argument 'num_heads' must be positive, got ", num_heads);
  KBN_CHECK(head_size > 0, "FlashAttnDecode: argument 'head_size' must be positive, got ", head_size);
  KBN_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "FlashAttnDecode: argument 'num_kv_heads' (",
            num_kv_heads, ") must be positive and divide 'num_heads' (", num_heads, ")");
  KBN_CHECK(scale > 0, "FlashAttnDecode: argument 'scale' must be positive, got ", scale);
}

Tensor FlashAttnDecode::forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                                const Tensor& seq_lens, const Tensor& block_tables, int64_t max_seq_len) {
  constexpr const char* op = "flash_attn_decode";
  check_rank(q, op, "q", 3, "[num_seqs, num_heads, head_size]");
  check_size(q, op, "q", 1, num_heads_, "num_heads");
  check_size(q, op, "q", 2, head_size_, "head_size");
  check_dtype(q, op, "q", {DType::f32, DType::f16, DType::bf16});
  for (const auto& [cache, name] : {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}}) {
    check_rank(*cache, op, name, 4, "[num_blocks, block_size, num_kv_heads, head_size]");
    check_size(*cache, op, name, 2, num_kv_heads_, "num_kv_heads");
    check_size(*cache, op, name, 3, head_size_, "head_size");
    check_same_dtype(*cache, q, op, name, "q");
    check_same_device(*cache, q, op, name, "q");
  }
  KBN_CHECK(value_cache.shape() == key_cache.shape(), op, ": argument 'value_cache' ", value_cache.str(),
            " must have the shape of 'key_cache' ", key_cache.str());
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

  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  if (num_seqs == 0) return out;
  KBN_CHECK(max_seq_len > 0, op, ": argument 'max_seq_len' must be positive when q has sequences, got ", max_seq_len,
            " for ", q.str());

  if (q.is_cpu()) {
    reference::paged_attention_decode(out, q, key_cache, value_cache, seq_lens, block_tables, scale_);
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

  if (!tensor_core_attention_supports(q.dtype(), head_size_)) {
    const GenericAttnParams g = generic_attention_params(q, key_cache, value_cache, out, nullptr, seq_lens,
                                                         block_tables, num_heads_, num_kv_heads_, head_size_, scale_);
    launch_generic_attention(g, q.dtype(), num_seqs, num_heads_, op, current_stream());
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
  p.head_chunks = (p.group_size + kRows - 1) / kRows;
  p.num_heads = int(num_heads_);
  p.scale_log2 = float(scale_ * 1.4426950408889634);
  dispatch_float16(q.dtype(), op, "q", [&](auto t) {
    dispatch_head_size(head_size_, op, [&](auto d) {
      launch_flash_attn_decode<decltype(t), decltype(d)::value>(p, q.device(), num_seqs, num_kv_heads_, max_seq_len,
                                                                current_stream());
    });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
