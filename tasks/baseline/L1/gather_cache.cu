#include "L1/gather_cache.h"

#include <cstdint>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/device_errors.h"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer ----

struct GatherCacheParams {
  const void* kv_cache;  // [num_blocks * block_size, row_units] contiguous
  void* out;             // [num_seqs, max_seq_len, row_units] contiguous
  const int32_t* block_tables;
  const int32_t* seq_lens;
  int64_t table_stride, num_blocks;
  int block_size, max_seq_len, row_units;
  DeviceErrorRecord* error;
  int32_t len_code, block_code;
};

constexpr int kWarps = 8, kThreads = 32 * kWarps;

// grid = (ceil(max_seq_len / kWarps), num_seqs): each warp copies one position's row (or zeros past the sequence's
// length) in Unit-wide pieces, lanes over the row.
template <class Unit>
__global__ void __launch_bounds__(kThreads) gather_cache_kernel(GatherCacheParams p) {
  const int seq = blockIdx.y, j = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= p.max_seq_len) return;
  const int len = p.seq_lens[seq];
  Unit* dst = static_cast<Unit*>(p.out) + (int64_t(seq) * p.max_seq_len + j) * p.row_units;
  const Unit* src = nullptr;
  if (len < 0 || len > p.max_seq_len) {
    if (j == 0 && lane == 0) {
      volatile DeviceErrorRecord* r = p.error;
      r->detail = seq;
      r->code = p.len_code;
    }
  } else if (j < len) {
    const int64_t block = p.block_tables[int64_t(seq) * p.table_stride + j / p.block_size];
    if (block >= 0 && block < p.num_blocks) {
      src = static_cast<const Unit*>(p.kv_cache) + (block * p.block_size + j % p.block_size) * p.row_units;
    } else if (lane == 0) {
      volatile DeviceErrorRecord* r = p.error;
      r->detail = seq;
      r->code = p.block_code;
    }
  }
  for (int i = lane; i < p.row_units; i += 32) dst[i] = src ? src[i] : Unit{};
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

Tensor GatherCache::forward(const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens,
                            int64_t max_seq_len) {
  constexpr const char* op = "gather_cache";
  check_rank(kv_cache, op, "kv_cache", 3, "[num_blocks, block_size, width]");
  check_dtype(kv_cache, op, "kv_cache", {DType::f32, DType::f16, DType::bf16});
  check_contiguous(kv_cache, op, "kv_cache");
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  check_dtype(block_tables, op, "block_tables", {DType::i32});
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_dtype(seq_lens, op, "seq_lens", {DType::i32});
  const int64_t S = seq_lens.size(0), W = kv_cache.size(2);
  check_size(block_tables, op, "block_tables", 0, S, "num_seqs = seq_lens.size(0)");
  check_same_device(kv_cache, block_tables, op, "kv_cache", "block_tables");
  check_same_device(kv_cache, seq_lens, op, "kv_cache", "seq_lens");
  KBN_CHECK(max_seq_len >= 0 && max_seq_len <= INT32_MAX, op, ": argument 'max_seq_len' must be in [0, 2^31), got ",
            max_seq_len);
  KBN_CHECK(kv_cache.size(1) > 0, op, ": argument 'kv_cache' ", kv_cache.str(), " has block_size 0");
  Tensor out = Tensor::empty({S, max_seq_len, W}, kv_cache.dtype(), kv_cache.device());
  if (kv_cache.is_cpu()) {
    reference::gather_cache(out, kv_cache, block_tables, seq_lens);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (S == 0 || max_seq_len == 0 || W == 0) return out;
  KBN_CHECK(S <= 65535, op, ": at most 65535 sequences per launch, got ", S);
  check_contiguous(seq_lens, op, "seq_lens");
  check_last_dim_contiguous(block_tables, op, "block_tables");
  static const int32_t len_code = device_error_code(
      "gather_cache: argument 'seq_lens'[{detail}] is outside [0, max_seq_len]; that sequence's rows were not "
      "gathered");
  static const int32_t block_code =
      device_error_code("gather_cache: argument 'block_tables' of sequence {detail} names a block outside the cache");
  const int64_t row_bytes = W * int64_t(kv_cache.element_size());
  GatherCacheParams p{.kv_cache = kv_cache.data_ptr(),
                      .out = out.data_ptr(),
                      .block_tables = block_tables.data<int32_t>(),
                      .seq_lens = seq_lens.data<int32_t>(),
                      .table_stride = block_tables.stride(0),
                      .num_blocks = kv_cache.size(0),
                      .block_size = int(kv_cache.size(1)),
                      .max_seq_len = int(max_seq_len),
                      .row_units = 0,
                      .error = device_error_record(),
                      .len_code = len_code,
                      .block_code = block_code};
  const dim3 grid(unsigned((max_seq_len + kWarps - 1) / kWarps), unsigned(S));
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(kv_cache.data_ptr()) % 16 == 0;
  if (vec) {
    p.row_units = int(row_bytes / 16);
    gather_cache_kernel<uint4><<<grid, kThreads, 0, current_stream()>>>(p);
  } else {
    p.row_units = int(row_bytes / 2);  // every supported dtype is a whole number of 2-byte units
    gather_cache_kernel<uint16_t><<<grid, kThreads, 0, current_stream()>>>(p);
  }
  KBN_CUDA_CHECK_LAUNCH();
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
