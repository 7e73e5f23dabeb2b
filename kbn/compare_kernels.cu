// Device-side reductions behind kbn/compare.h. Grid-stride loops with warp reductions and one set of
// atomics per warp: utilities for validation, not benchmarked ops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kbn/compare.h"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device.h"

namespace kbn::cuda {
namespace {

struct DeviceStats {
  double sum_abs_err, sum_abs_expected, sum_sq_expected;
  unsigned long long bad, nan_actual, nan_expected;
  unsigned long long first_bad, first_nan_actual;
  unsigned int max_err_bits;  // non-negative float: its bits order like the value
};

__device__ __forceinline__ double load_value(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ double load_value(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ double load_value(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ double load_value(const __nv_fp8_e4m3* p, int64_t i) { return float(p[i]); }
__device__ __forceinline__ double load_value(const int32_t* p, int64_t i) { return double(p[i]); }
__device__ __forceinline__ double load_value(const int64_t* p, int64_t i) { return double(p[i]); }
__device__ __forceinline__ double load_value(const uint8_t* p, int64_t i) { return double(p[i]); }
__device__ __forceinline__ double load_value(const bool* p, int64_t i) { return p[i] ? 1.0 : 0.0; }

template <class T>
__device__ __forceinline__ bool exactly_equal(const T* a, const T* e, int64_t i) {
  if constexpr (std::is_integral_v<T>) return a[i] == e[i];
  return load_value(a, i) == load_value(e, i);
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ unsigned long long warp_min(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ unsigned int warp_max(unsigned int v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Pass 1: sum of squares of `expected` (for the rms-scaled atol).
template <class T>
__global__ void sum_sq_kernel(const T* __restrict__ e, int64_t n, DeviceStats* out) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = load_value(e, i);
    if (!isnan(v)) s += v * v;
  }
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) atomicAdd(&out->sum_sq_expected, s);
}

// Pass 2: everything else. Every lane leaves the loop before the shuffles, so all 32 take part.
template <class T>
__global__ void compare_kernel(const T* __restrict__ a, const T* __restrict__ e, int64_t n, double rtol, double atol,
                               bool exact, DeviceStats* out) {
  double sum_err = 0, sum_exp = 0;
  unsigned long long bad = 0, nan_a = 0, nan_e = 0, first_bad = ULLONG_MAX, first_nan = ULLONG_MAX;
  float max_err = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const double va = load_value(a, i), ve = load_value(e, i);
    const bool na = isnan(va), ne = isnan(ve);
    nan_a += na;
    nan_e += ne;
    if (na) first_nan = min(first_nan, (unsigned long long)i);
    bool ok;
    if (na || ne) {
      ok = false;
    } else {
      const double err = fabs(va - ve);
      if (isfinite(err)) {
        sum_err += err;
        max_err = fmaxf(max_err, float(err));
      }
      sum_exp += fabs(ve);
      ok = exact ? exactly_equal(a, e, i) : err <= atol + rtol * fabs(ve);
    }
    if (!ok) {
      bad++;
      first_bad = min(first_bad, (unsigned long long)i);
    }
  }
  sum_err = warp_sum(sum_err);
  sum_exp = warp_sum(sum_exp);
  bad = warp_sum(bad);
  nan_a = warp_sum(nan_a);
  nan_e = warp_sum(nan_e);
  first_bad = warp_min(first_bad);
  first_nan = warp_min(first_nan);
  const unsigned int max_bits = warp_max(__float_as_uint(max_err));
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&out->sum_abs_err, sum_err);
    atomicAdd(&out->sum_abs_expected, sum_exp);
    if (bad) atomicAdd(&out->bad, bad);
    if (nan_a) atomicAdd(&out->nan_actual, nan_a);
    if (nan_e) atomicAdd(&out->nan_expected, nan_e);
    if (first_bad != ULLONG_MAX) atomicMin(&out->first_bad, first_bad);
    if (first_nan != ULLONG_MAX) atomicMin(&out->first_nan_actual, first_nan);
    atomicMax(&out->max_err_bits, max_bits);
  }
}

// Elements (of `es` bytes) that differ between a and b (mode 0), or whose bytes all equal `byte` (mode 1).
__global__ void bytes_kernel(const unsigned char* __restrict__ a, const unsigned char* __restrict__ b, int64_t n,
                             int es, int mode, unsigned char byte, unsigned long long* count,
                             unsigned long long* first) {
  unsigned long long c = 0, f = ULLONG_MAX;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    bool hit;
    if (mode == 0) {
      hit = false;
      for (int k = 0; k < es; ++k) hit |= a[i * es + k] != b[i * es + k];
    } else {
      hit = true;
      for (int k = 0; k < es; ++k) hit &= a[i * es + k] == byte;
    }
    if (hit) {
      c++;
      f = min(f, (unsigned long long)i);
    }
  }
  c = warp_sum(c);
  f = warp_min(f);
  if ((threadIdx.x & 31) == 0 && c) {
    atomicAdd(count, c);
    atomicMin(first, f);
  }
}

// Stream-ordered on the current stream (the op's), then waited for: compares see the op's finished work.
void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  KBN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, current_stream()));
  KBN_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

unsigned grid_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 132 * 16)); }

template <class F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(__half{});
    case DType::bf16:
      return f(__nv_bfloat16{});
    case DType::fp8e4m3:
      return f(__nv_fp8_e4m3{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::u8:
      return f(uint8_t{});
    case DType::boolean:
      return f(bool{});
  }
  KBN_FAIL("compare_close: unsupported dtype ", dtype_name(dt));
}

// Runs on the tensors' device; the scratch result lives in device memory and comes back synchronously.
struct Scratch {
  explicit Scratch(size_t bytes) { KBN_CUDA_CHECK(cudaMalloc(&ptr, bytes)); }
  ~Scratch() { cudaFree(ptr); }
  void* ptr = nullptr;
};

}  // namespace

CompareStats compare_close(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
  const DeviceGuard scope(actual.device());
  const int64_t n = actual.numel();
  CompareStats s;
  s.numel = n;
  if (n == 0) return s;
  Scratch scratch(sizeof(DeviceStats));
  auto* d = static_cast<DeviceStats*>(scratch.ptr);
  DeviceStats init{};
  init.first_bad = init.first_nan_actual = ULLONG_MAX;
  copy_sync(d, &init, sizeof init, cudaMemcpyHostToDevice);
  const bool exact = tol.exact() || !is_floating(actual.dtype());
  dispatch_all(actual.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(actual.data_ptr());
    const T* pe = static_cast<const T*>(expected.data_ptr());
    sum_sq_kernel<T><<<grid_for(n), 256, 0, current_stream()>>>(pe, n, d);
    KBN_CUDA_CHECK(cudaGetLastError());
    DeviceStats mid{};
    copy_sync(&mid, d, sizeof mid, cudaMemcpyDeviceToHost);
    const double rms = std::sqrt(mid.sum_sq_expected / double(n));
    compare_kernel<T>
        <<<grid_for(n), 256, 0, current_stream()>>>(pa, pe, n, tol.rtol, tol.atol_abs + tol.atol_rms * rms, exact, d);
    KBN_CUDA_CHECK(cudaGetLastError());
  });
  DeviceStats r{};
  copy_sync(&r, d, sizeof r, cudaMemcpyDeviceToHost);
  s.bad = int64_t(r.bad);
  s.nan_actual = int64_t(r.nan_actual);
  s.nan_expected = int64_t(r.nan_expected);
  s.first_bad = r.first_bad == ULLONG_MAX ? -1 : int64_t(r.first_bad);
  s.first_nan_actual = r.first_nan_actual == ULLONG_MAX ? -1 : int64_t(r.first_nan_actual);
  s.sum_abs_err = r.sum_abs_err;
  s.sum_abs_expected = r.sum_abs_expected;
  s.sum_sq_expected = r.sum_sq_expected;
  float max_err = 0;
  std::memcpy(&max_err, &r.max_err_bits, sizeof max_err);
  s.max_abs_err = max_err;
  if (s.first_bad >= 0) {
    s.actual_at_first_bad = actual.as_strided({1}, {1}, actual.offset() + s.first_bad).to_doubles()[0];
    s.expected_at_first_bad = expected.as_strided({1}, {1}, expected.offset() + s.first_bad).to_doubles()[0];
  }
  return s;
}

namespace {
int64_t run_bytes_kernel(const Tensor& a, const Tensor* b, int mode, unsigned char byte, int64_t* first) {
  const DeviceGuard scope(a.device());
  const int64_t n = a.numel();
  if (first) *first = -1;
  if (n == 0) return 0;
  Scratch scratch(2 * sizeof(unsigned long long));
  auto* d = static_cast<unsigned long long*>(scratch.ptr);
  const unsigned long long init[2] = {0, ULLONG_MAX};
  copy_sync(d, init, sizeof init, cudaMemcpyHostToDevice);
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = b ? static_cast<const unsigned char*>(b->data_ptr()) : pa;
  bytes_kernel<<<grid_for(n), 256, 0, current_stream()>>>(pa, pb, n, int(a.element_size()), mode, byte, d, d + 1);
  KBN_CUDA_CHECK(cudaGetLastError());
  unsigned long long r[2];
  copy_sync(r, d, sizeof r, cudaMemcpyDeviceToHost);
  if (first && r[0]) *first = int64_t(r[1]);
  return int64_t(r[0]);
}
}  // namespace

int64_t count_bitwise_mismatches(const Tensor& a, const Tensor& b, int64_t* first) {
  return run_bytes_kernel(a, &b, 0, 0, first);
}

int64_t count_poisoned(const Tensor& t, unsigned char byte, int64_t* first) {
  return run_bytes_kernel(t, nullptr, 1, byte, first);
}

}  // namespace kbn::cuda
