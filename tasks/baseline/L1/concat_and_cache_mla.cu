#include "L1/concat_and_cache_mla.h"

#include <cstdint>
#include <limits>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/device_errors.h"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in copy units, a stream ----

struct ConcatAndCacheMLAParams {
  const void* kv_c;             // [num_tokens, c_units] token stride c_stride
  const void* k_pe;             // [num_tokens, pe_units] token stride pe_stride
  void* kv_cache;               // [num_slots, c_units + pe_units] contiguous
  const int64_t* slot_mapping;  // [num_tokens] stride slot_stride
  int64_t c_stride, pe_stride, slot_stride;
  int64_t num_slots;  // num_blocks * block_size
  int c_units, pe_units;
  DeviceErrorRecord* error;
  int32_t slot_code;
};

constexpr int kThreads = 64;

// One block per token copies kv_c then k_pe into the row of its slot: with a contiguous cache the row of slot s
// starts at s * row_units. A DeepSeek-V2 row (512 + 64 bf16) is 72 16-byte units: 64 threads, two units for some.
// Padding tokens (slot -1) are skipped; a slot outside the cache is reported and its row left unwritten.
template <class Unit>
__global__ void __launch_bounds__(kThreads) concat_and_cache_mla_kernel(ConcatAndCacheMLAParams p) {
  pdl_wait();  // dependent launch: nothing is touched before the grids before this one are done
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t * p.slot_stride];
  if (slot == -1) return;
  if (slot < 0 || slot >= p.num_slots) {
    if (threadIdx.x == 0) {
      volatile DeviceErrorRecord* r = p.error;
      r->detail = t;
      r->code = p.slot_code;
    }
    return;
  }
  const int row_units = p.c_units + p.pe_units;
  const Unit* c = static_cast<const Unit*>(p.kv_c) + t * p.c_stride;
  const Unit* pe = static_cast<const Unit*>(p.k_pe) + t * p.pe_stride;
  Unit* row = static_cast<Unit*>(p.kv_cache) + slot * row_units;
  for (int i = threadIdx.x; i < row_units; i += kThreads) row[i] = i < p.c_units ? c[i] : pe[i - p.c_units];
}

bool aligned16(const void* q, int64_t stride_elems, size_t esize) {
  return reinterpret_cast<uintptr_t>(q) % 16 == 0 && (stride_elems * int64_t(esize)) % 16 == 0;
}

template <class Unit>
void launch_concat_and_cache_mla(ConcatAndCacheMLAParams p, int64_t num_tokens, int64_t c_bytes, int64_t pe_bytes,
                                 size_t esize, Stream stream) {
  constexpr int64_t U = sizeof(Unit);
  const int64_t e = int64_t(esize);
  p.c_units = int(c_bytes / U);
  p.pe_units = int(pe_bytes / U);
  p.c_stride = p.c_stride * e / U;
  p.pe_stride = p.pe_stride * e / U;
  launch_pdl(concat_and_cache_mla_kernel<Unit>, unsigned(num_tokens), kThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

void ConcatAndCacheMLA::forward(const Tensor& kv_c, const Tensor& k_pe, const Tensor& kv_cache,
                                const Tensor& slot_mapping) {
  constexpr const char* op = "concat_and_cache_mla";
  check_rank(kv_c, op, "kv_c", 2, "[num_tokens, kv_lora_rank]");
  check_rank(k_pe, op, "k_pe", 2, "[num_tokens, rope_dim]");
  check_rank(kv_cache, op, "kv_cache", 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]");
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(kv_c, op, "kv_c", {DType::f32, DType::f16, DType::bf16});
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i64});
  check_same_dtype(kv_c, k_pe, op, "kv_c", "k_pe");
  check_same_dtype(kv_c, kv_cache, op, "kv_c", "kv_cache");
  check_same_device(kv_c, k_pe, op, "kv_c", "k_pe");
  check_same_device(kv_c, kv_cache, op, "kv_c", "kv_cache");
  check_same_device(kv_c, slot_mapping, op, "kv_c", "slot_mapping");
  const int64_t T = kv_c.size(0), L = kv_c.size(1), R = k_pe.size(1);
  check_size(k_pe, op, "k_pe", 0, T, "num_tokens = kv_c.size(0)");
  check_size(slot_mapping, op, "slot_mapping", 0, T, "num_tokens = kv_c.size(0)");
  check_size(kv_cache, op, "kv_cache", 2, L + R, "kv_lora_rank + rope_dim = kv_c.size(1) + k_pe.size(1)");
  check_last_dim_contiguous(kv_c, op, "kv_c");
  check_last_dim_contiguous(k_pe, op, "k_pe");
  check_contiguous(kv_cache, op, "kv_cache");
  if (kv_c.is_cpu()) {
    Tensor cache = kv_cache;
    reference::concat_and_cache_mla(cache, kv_c, k_pe, slot_mapping);
    return;
  }
#ifdef KBN_WITH_CUDA
  if (T == 0) return;
  KBN_CHECK(T <= std::numeric_limits<int32_t>::max(), op, ": argument 'kv_c' has ", T,
            " tokens; the kernel's grid takes at most 2^31 - 1");
  static const int32_t slot_code = device_error_code(
      "concat_and_cache_mla: argument 'slot_mapping'[{detail}] is outside the cache [0, num_blocks * block_size) "
      "(-1: a padding token); that token's row was not written");
  const size_t es = kv_c.element_size();
  const ConcatAndCacheMLAParams p{.kv_c = kv_c.data_ptr(),
                                  .k_pe = k_pe.data_ptr(),
                                  .kv_cache = kv_cache.data_ptr(),
                                  .slot_mapping = slot_mapping.data<int64_t>(),
                                  .c_stride = kv_c.stride(0),
                                  .pe_stride = k_pe.stride(0),
                                  .slot_stride = slot_mapping.stride(0),
                                  .num_slots = kv_cache.size(0) * kv_cache.size(1),
                                  .c_units = 0,
                                  .pe_units = 0,
                                  .error = device_error_record(),
                                  .slot_code = slot_code};
  const int64_t c_bytes = L * int64_t(es), pe_bytes = R * int64_t(es);
  const bool vec = c_bytes % 16 == 0 && pe_bytes % 16 == 0 && aligned16(p.kv_c, p.c_stride, es) &&
                   aligned16(p.k_pe, p.pe_stride, es) && aligned16(p.kv_cache, 0, es);
  // Every supported dtype is 2 or 4 bytes wide, so 2-byte units always divide rows and strides.
  if (vec)
    launch_concat_and_cache_mla<uint4>(p, T, c_bytes, pe_bytes, es, current_stream());
  else
    launch_concat_and_cache_mla<uint16_t>(p, T, c_bytes, pe_bytes, es, current_stream());
#endif
}

}  // namespace kbn::KBN_VARIANT
