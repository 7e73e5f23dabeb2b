#pragma once
// One dispatch mechanism with an error default: every switch over dtypes or sizes names the op, the
// argument and the supported set when it meets a value outside it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kbn/dtype.h"
#include "kbn/error.h"

namespace kbn {

template <class T>
struct cuda_type_of;
template <>
struct cuda_type_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct cuda_type_of<__half> {
  static constexpr DType value = DType::f16;
};
template <>
struct cuda_type_of<__nv_bfloat16> {
  static constexpr DType value = DType::bf16;
};

// f(T{}) for the CUDA scalar type of dt among f32/f16/bf16.
template <class F>
void dispatch_float16_32(DType dt, const char* op, const char* arg, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      return;
    case DType::f16:
      f(__half{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    default:
      KBN_FAIL(op, ": argument '", arg, "' has dtype ", dtype_name(dt), "; supported: f32, f16, bf16");
  }
}

// f(T{}) for f16/bf16 only (ops whose fast path is defined on 16-bit types).
template <class F>
void dispatch_float16(DType dt, const char* op, const char* arg, F&& f) {
  switch (dt) {
    case DType::f16:
      f(__half{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    default:
      KBN_FAIL(op, ": argument '", arg, "' has dtype ", dtype_name(dt), "; supported: f16, bf16");
  }
}

// f(std::integral_constant<int, P>{}) with P the smallest power of two >= n, for 1 <= n <= kMax (a power of two): a
// kernel's per-lane or per-pass width picked from a runtime count. The callers check n against kMax first.
template <int kMax, int P = 1, class F>
void dispatch_pow2(int64_t n, F&& f) {
  static_assert(kMax >= 1 && (kMax & (kMax - 1)) == 0, "kMax is a power of two");
  if constexpr (P >= kMax)
    f(std::integral_constant<int, kMax>{});
  else if (n <= P)
    f(std::integral_constant<int, P>{});
  else
    dispatch_pow2<kMax, 2 * P>(n, static_cast<F&&>(f));
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 v) { return float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_f32<__nv_fp8_e4m3>(float v) {
  return __nv_fp8_e4m3(v);
}

// a / scale, b / scale, c / scale, d / scale, each rounded once to e4m3 (nearest even, saturated to +-448: the scalar
// conversion's rounding), packed in order into one 32-bit word: the fp8 pages' store (store_kvcache,
// fused_rope_kvcache), one definition so that both write the same bits.
__device__ __forceinline__ uint32_t fp8x4_e4m3(float a, float b, float c, float d, float scale) {
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a / scale, b / scale), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c / scale, d / scale), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// 16-byte vector of T for vectorised loads/stores.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

}  // namespace kbn
