#include "L1/moe_align_block_size.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----
//
// The pairs are cut into chunks of kChunk. Three launches, none of which syncs with the host:
//   count:   one warp per chunk counts its pairs per expert -> counts[chunk][expert]
//   scan:    one CTA, a thread per expert: each expert's total, its padded start (an exclusive scan over experts),
//            counts rewritten as each chunk's first slot for that expert, expert_ids (num_experts past the end),
//            the padding and the tail
//   scatter: one warp per chunk walks its pairs in order and writes each to its expert's next slot
// The warp walks 32 pairs per round; lanes holding the same expert find each other with __match_any_sync and take
// consecutive slots in lane order, so the order within an expert is increasing pair index (stable), as the oracle's.
constexpr int kChunk = 1024;
constexpr int kMaxExperts = 1024;

struct AlignParams {
  const int32_t* ids;  // [num_pairs]
  int32_t* sorted;     // [max_padded]
  int32_t* experts;    // [max_padded / block_size]
  int32_t* post_padded;
  int32_t* counts;  // [num_chunks, num_experts]
  int num_pairs, num_experts, block_size, max_padded, num_chunks;
};

// kScatter false: counts this chunk's pairs per expert into counts[chunk]. true: writes each pair p of the chunk to
// sorted[counts[chunk][e]++].
template <bool kScatter>
__global__ void __launch_bounds__(32) moe_align_chunk_kernel(AlignParams p) {
  extern __shared__ int32_t next[];  // [num_experts]
  const int chunk = blockIdx.x, lane = threadIdx.x;
  int32_t* row = p.counts + int64_t(chunk) * p.num_experts;
  for (int e = lane; e < p.num_experts; e += 32) next[e] = kScatter ? row[e] : 0;
  __syncwarp();
  const int begin = chunk * kChunk, end = min(begin + kChunk, p.num_pairs);
  for (int base = begin; base < end; base += 32) {
    const int pair = base + lane;
    const int id = pair < end ? p.ids[pair] : -1;
    const bool valid = id >= 0 && id < p.num_experts;
    const unsigned active = __ballot_sync(0xffffffffu, valid);
    // Lanes without a valid pair match among themselves under key -1 and are ignored.
    const unsigned peers = __match_any_sync(0xffffffffu, valid ? id : -1) & active;
    if (valid) {
      const int rank = __popc(peers & ((1u << lane) - 1u));
      const int slot = next[id] + rank;
      if constexpr (kScatter) p.sorted[slot] = pair;
      __syncwarp(peers);
      if (rank == 0) next[id] = slot + __popc(peers);
    }
    __syncwarp();
  }
  if constexpr (!kScatter)
    for (int e = lane; e < p.num_experts; e += 32) row[e] = next[e];
}

__global__ void __launch_bounds__(kMaxExperts) moe_align_scan_kernel(AlignParams p) {
  __shared__ int32_t warp_sums[kMaxExperts / 32];
  __shared__ int32_t total_padded;
  const int e = threadIdx.x, lane = e % 32, warp = e / 32;
  const bool mine = e < p.num_experts;
  // This expert's pairs, with counts turned into the exclusive prefix over chunks.
  int32_t count = 0;
  if (mine)
    for (int c = 0; c < p.num_chunks; ++c) {
      int32_t* cell = p.counts + int64_t(c) * p.num_experts + e;
      const int32_t here = *cell;
      *cell = count;
      count += here;
    }
  const int32_t padded = (count + p.block_size - 1) / p.block_size * p.block_size;
  // Exclusive scan of the padded sizes over the experts: within each warp, then over the warps.
  int32_t incl = padded;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int32_t v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    int32_t w = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int32_t v = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += v;
    }
    if (lane < nw) warp_sums[lane] = w;  // inclusive over warps
    if (lane == nw - 1) total_padded = w;
  }
  __syncthreads();
  const int32_t start = incl - padded + (warp > 0 ? warp_sums[warp - 1] : 0);
  const int32_t total = total_padded;
  if (mine) {
    for (int c = 0; c < p.num_chunks; ++c) p.counts[int64_t(c) * p.num_experts + e] += start;
    for (int32_t b = start / p.block_size; b < (start + padded) / p.block_size; ++b) p.experts[b] = e;
    for (int32_t i = start + count; i < start + padded; ++i) p.sorted[i] = p.num_pairs;
  }
  if (e == 0) *p.post_padded = total;
  for (int32_t i = total + e; i < p.max_padded; i += blockDim.x) p.sorted[i] = p.num_pairs;
  for (int32_t b = total / p.block_size + e; b < p.max_padded / p.block_size; b += blockDim.x) p.experts[b] = p.num_experts;
}

void launch_moe_align(const AlignParams& p, Stream stream) {
  const size_t smem = size_t(p.num_experts) * sizeof(int32_t);
  if (p.num_chunks > 0) {
    moe_align_chunk_kernel<false><<<p.num_chunks, 32, smem, stream>>>(p);
    KBN_CUDA_CHECK_LAUNCH();
  }
  const int threads = (p.num_experts + 31) / 32 * 32;
  moe_align_scan_kernel<<<1, threads, 0, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
  if (p.num_chunks > 0) {
    moe_align_chunk_kernel<true><<<p.num_chunks, 32, smem, stream>>>(p);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

MoeAlignBlockSize::MoeAlignBlockSize(int64_t block_size, int64_t num_experts)
    : block_size_(block_size), num_experts_(num_experts) {
  KBN_CHECK(block_size >= 1, "MoeAlignBlockSize: block_size must be positive, got ", block_size);
  KBN_CHECK(num_experts >= 1, "MoeAlignBlockSize: num_experts must be positive, got ", num_experts);
}

int64_t MoeAlignBlockSize::max_padded(int64_t num_pairs, int64_t block_size, int64_t num_experts) {
  const int64_t worst = num_pairs + num_experts * (block_size - 1);
  return (worst + block_size - 1) / block_size * block_size;
}

std::tuple<Tensor, Tensor, Tensor> MoeAlignBlockSize::forward(const Tensor& topk_ids) {
  constexpr const char* kOp = "moe_align_block_size";
  check_rank(topk_ids, kOp, "topk_ids", 2, "[num_tokens, top_k]");
  check_dtype(topk_ids, kOp, "topk_ids", {DType::i32});
  check_contiguous(topk_ids, kOp, "topk_ids");
  const int64_t pairs = topk_ids.numel(), padded = max_padded(pairs, block_size_, num_experts_);
  KBN_CHECK(padded <= std::numeric_limits<int32_t>::max(), kOp, ": argument 'topk_ids' ", topk_ids.str(), " with ",
            num_experts_, " experts and block_size ", block_size_, " needs ", padded, " sorted slots; i32 holds fewer");
  const Device d = topk_ids.device();
  Tensor sorted = Tensor::empty({padded}, DType::i32, d);
  Tensor experts = Tensor::empty({padded / block_size_}, DType::i32, d);
  Tensor post = Tensor::empty({1}, DType::i32, d);
  if (topk_ids.is_cpu()) {
    reference::moe_align_block_size(sorted, experts, post, topk_ids, block_size_, num_experts_);
    return {sorted, experts, post};
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(num_experts_ <= kMaxExperts, kOp, ": num_experts ", num_experts_, " exceeds the kernel's ", kMaxExperts,
            " (one thread per expert in the scan)");
  const int num_chunks = int((pairs + kChunk - 1) / kChunk);
  Tensor counts = Tensor::empty({std::max(num_chunks, 1), num_experts_}, DType::i32, d);
  const AlignParams p{.ids = topk_ids.data<int32_t>(),
                      .sorted = sorted.data<int32_t>(),
                      .experts = experts.data<int32_t>(),
                      .post_padded = post.data<int32_t>(),
                      .counts = counts.data<int32_t>(),
                      .num_pairs = int(pairs),
                      .num_experts = int(num_experts_),
                      .block_size = int(block_size_),
                      .max_padded = int(padded),
                      .num_chunks = num_chunks};
  launch_moe_align(p, current_stream());
#endif
  return {sorted, experts, post};
}

}  // namespace kbn::KBN_VARIANT
