#pragma once
// Helpers of the GEMV kernels that stream weight rows once (linear.cu's one-token path, fused_experts.cu's decode
// path): a 16-byte load that bypasses L1 (the weights are read once; L1 keeps the activation vectors every warp of the
// SM re-reads) and the dot product of two 16-byte vectors of a 16-bit or f32 type, accumulated in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kbn::KBN_VARIANT {
namespace {

// 16 bytes of a weight row, read once: not allocated in L1.
__device__ __forceinline__ uint4 load_weight(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// acc + <a, b> over the 16 bytes of T in each of a and b (8 elements of a 16-bit type, 4 of f32).
template <class T>
__device__ __forceinline__ float dot16(uint4 a, uint4 b, float acc) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      acc = fmaf(__uint_as_float(wa[j]), __uint_as_float(wb[j]), acc);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      acc = fmaf(__uint_as_float(wa[j] << 16), __uint_as_float(wb[j] << 16), acc);
      acc = fmaf(__uint_as_float(wa[j] & 0xffff0000u), __uint_as_float(wb[j] & 0xffff0000u), acc);
    } else {
      static_assert(std::is_same_v<T, __half>);
      __half2 ha, hb;
      __builtin_memcpy(&ha, &wa[j], sizeof(ha));
      __builtin_memcpy(&hb, &wb[j], sizeof(hb));
      const float2 fa = __half22float2(ha), fb = __half22float2(hb);
      acc = fmaf(fa.x, fb.x, acc);
      acc = fmaf(fa.y, fb.y, acc);
    }
  }
  return acc;
}

// The sum of v over the warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace
}  // namespace kbn::KBN_VARIANT
