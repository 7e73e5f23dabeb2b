#pragma once
// Hopper tensor-memory-accelerator copies: the host encodes a tensor map (cuTensorMapEncodeTiled, fetched from the
// driver so nothing links libcuda), a kernel takes it as a `const __grid_constant__ CUtensorMap` parameter and one
// thread copies a box of it into shared memory with cp.async.bulk.tensor, completing the bytes on an mbarrier
// (L1/mbarrier.cuh); bulk_copy_g2s copies contiguous bytes the same way without a map. Included by the Hopper
// kernels' .cu files under KBN_WITH_CUDA.
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types
#include <cuda_runtime.h>

#include <cstdint>

namespace kbn::KBN_VARIANT {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, or null when the driver has none.
inline EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// `bytes` (a multiple of 16; 16-byte-aligned addresses) from global to shared memory, completing on mbarrier `bar`:
// a bulk copy without a tensor map.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// One box of a 2-D tensor map at (c0 = the contiguous dimension, c1); out-of-range elements land as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// One box of a 4-D tensor map at coordinates (c0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
#endif

}  // namespace
}  // namespace kbn::KBN_VARIANT
