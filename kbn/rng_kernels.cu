// GPU side of kbn/rng.h: the same (seed, index) -> value function as the CPU path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kbn/cuda_check.h"
#include "kbn/rng.h"

namespace kbn::cuda {
namespace {

template <class T>
__device__ __forceinline__ void put(T* p, int64_t i, double v);
template <>
__device__ __forceinline__ void put(float* p, int64_t i, double v) {
  p[i] = float(v);
}
template <>
__device__ __forceinline__ void put(__half* p, int64_t i, double v) {
  p[i] = __float2half_rn(float(v));
}
template <>
__device__ __forceinline__ void put(__nv_bfloat16* p, int64_t i, double v) {
  p[i] = __float2bfloat16_rn(float(v));
}
template <>
__device__ __forceinline__ void put(__nv_fp8_e4m3* p, int64_t i, double v) {
  p[i] = __nv_fp8_e4m3(float(v));  // round to nearest even, saturating: float_to_fp8e4m3 on the host
}
template <>
__device__ __forceinline__ void put(int32_t* p, int64_t i, double v) {
  p[i] = int32_t(v);
}
template <>
__device__ __forceinline__ void put(int64_t* p, int64_t i, double v) {
  p[i] = int64_t(v);
}

template <class T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, int kind, double a, double b) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    Philox4x32 r = philox4x32_10(uint64_t(i), seed);
    double v;
    if (kind == 0) {
      float u1 = u32_to_unit(r.v[0]), u2 = u32_to_unit(r.v[1]);
      // Full-precision math functions (no --use_fast_math) to match the host path.
      float z = sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
      v = a + b * double(z);
    } else if (kind == 1) {
      v = a + (b - a) * double(u32_to_unit(r.v[0]));
    } else {
      uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
      v = double(int64_t(a) + int64_t(x % uint64_t(int64_t(b) - int64_t(a))));
    }
    put(out, i, v);
  }
}

}  // namespace

void fill_random(Tensor& t, uint64_t seed, int kind, double a, double b) {
  int64_t n = t.numel();
  if (n == 0) return;
  unsigned grid = unsigned(std::min<int64_t>((n + 255) / 256, 65535 * 4));
  Stream s = current_stream();
  switch (t.dtype()) {
    case DType::f32:
      fill_random_kernel<<<grid, 256, 0, s>>>(t.data<float>(), n, seed, kind, a, b);
      break;
    case DType::f16:
      fill_random_kernel<<<grid, 256, 0, s>>>(static_cast<__half*>(t.data_ptr()), n, seed, kind, a, b);
      break;
    case DType::bf16:
      fill_random_kernel<<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(t.data_ptr()), n, seed, kind, a, b);
      break;
    case DType::fp8e4m3:
      fill_random_kernel<<<grid, 256, 0, s>>>(static_cast<__nv_fp8_e4m3*>(t.data_ptr()), n, seed, kind, a, b);
      break;
    case DType::i32:
      fill_random_kernel<<<grid, 256, 0, s>>>(t.data<int32_t>(), n, seed, kind, a, b);
      break;
    case DType::i64:
      fill_random_kernel<<<grid, 256, 0, s>>>(t.data<int64_t>(), n, seed, kind, a, b);
      break;
    default:
      KBN_FAIL("fill_random: unsupported dtype on CUDA: ", t.str());
  }
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace kbn::cuda
