// Kernels behind Tensor::copy_/fill_/to(dtype) on CUDA tensors. Simple grid-stride loops: these are
// utilities, not benchmarked ops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/cuda_ops.h"
#include "kbn/tensor.h"

namespace kbn::cuda {
namespace {

template <class S, class D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = v;
}

struct StridedParams {
  int nd;
  int64_t shape[8];
  int64_t src_strides[8];
  int64_t dst_strides[8];
};

template <class T>
__global__ void strided_copy_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n, StridedParams p) {
  for (int64_t li = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; li < n; li += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = li, so = 0, d_off = 0;
    for (int d = p.nd - 1; d >= 0; --d) {
      int64_t idx = rem % p.shape[d];
      rem /= p.shape[d];
      so += idx * p.src_strides[d];
      d_off += idx * p.dst_strides[d];
    }
    dst[d_off] = src[so];
  }
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65535 * 4)); }

template <class F>
void dispatch_float(DType dt, const char* what, F&& f) {
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
    case DType::fp8e4m3:
      f(__nv_fp8_e4m3{});
      return;
    default:
      KBN_FAIL(what, ": expected a floating dtype (f32, f16, bf16, fp8e4m3), got ", dtype_name(dt));
  }
}

// At most kIndexedPairs index pairs per launch: with the two pointers, under the classic 4 KiB of kernel parameters.
constexpr int kIndexedPairs = 496;
struct IndexedPairs {
  int32_t n;
  int32_t dst[kIndexedPairs];
  int32_t src[kIndexedPairs];
};

__global__ void copy_indexed_i64_kernel(int64_t* __restrict__ dst, const int64_t* __restrict__ src, IndexedPairs p) {
  for (int k = threadIdx.x; k < p.n; k += blockDim.x) dst[p.dst[k]] = src[p.src[k]];
}

__global__ void iota_i32_kernel(int32_t* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = int32_t(i);
}

}  // namespace

void iota_i32(int32_t* dst, int64_t n) {
  if (n == 0) return;
  iota_i32_kernel<<<grid_for(n), 256, 0, current_stream()>>>(dst, n);
  KBN_CUDA_CHECK_LAUNCH();
}

void copy_indexed_i64(int64_t* dst, const int64_t* src, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  for (size_t at = 0; at < pairs.size(); at += kIndexedPairs) {
    IndexedPairs p{};
    p.n = int32_t(std::min(pairs.size() - at, size_t(kIndexedPairs)));
    for (int k = 0; k < p.n; ++k) {
      p.dst[k] = pairs[at + size_t(k)].first;
      p.src[k] = pairs[at + size_t(k)].second;
    }
    copy_indexed_i64_kernel<<<1, 128, 0, current_stream()>>>(dst, src, p);
    KBN_CUDA_CHECK_LAUNCH();
  }
}

void convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n, int device) {
  (void)device;
  if (n == 0) return;
  dispatch_float(sdt, "convert", [&](auto s) {
    dispatch_float(ddt, "convert", [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      convert_kernel<S, D>
          <<<grid_for(n), 256, 0, current_stream()>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      KBN_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(void* dst, DType dt, int64_t n, double value, int device) {
  (void)device;
  if (n == 0) return;
  Stream s = current_stream();
  switch (dt) {
    case DType::f32:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<float*>(dst), n, float(value));
      break;
    case DType::f16:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<__half*>(dst), n, __double2half(value));
      break;
    case DType::bf16:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n, __double2bfloat16(value));
      break;
    case DType::fp8e4m3:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint8_t*>(dst), n, float_to_fp8e4m3(float(value)).bits);
      break;
    case DType::i32:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<int32_t*>(dst), n, int32_t(value));
      break;
    case DType::i64:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<int64_t*>(dst), n, int64_t(value));
      break;
    case DType::u8:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint8_t*>(dst), n, uint8_t(value));
      break;
    case DType::boolean:
      fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint8_t*>(dst), n, uint8_t(value != 0));
      break;
  }
  KBN_CUDA_CHECK_LAUNCH();
}

// Drops size-1 dimensions and merges a dimension into the next when both tensors step through them as one
// (stride[d] == stride[d + 1] * shape[d + 1] in src and in dst), so a [tokens, heads, head] slice of a fused qkv
// row becomes [tokens, heads * head]: fewer divisions per element in the kernel.
void collapse_dims(StridedParams& p) {
  StridedParams q{};
  for (int d = 0; d < p.nd; ++d) {
    if (p.shape[d] == 1) continue;
    if (q.nd > 0) {
      const int l = q.nd - 1;  // q's last dimension so far, which d would extend outward
      if (q.src_strides[l] * q.shape[l] == p.src_strides[d] && q.dst_strides[l] * q.shape[l] == p.dst_strides[d]) {
        q.shape[l] *= p.shape[d];
        continue;
      }
    }
    q.shape[q.nd] = p.shape[d];
    q.src_strides[q.nd] = p.src_strides[d];
    q.dst_strides[q.nd] = p.dst_strides[d];
    ++q.nd;
  }
  p = q;
}

void strided_copy(const Tensor& dst, const Tensor& src) {
  KBN_CHECK(dst.dtype() == src.dtype(), "strided_copy: dtypes differ: ", dst.str(), " vs ", src.str());
  KBN_CHECK(dst.dim() <= 8, "strided_copy: at most 8 dimensions, got ", dst.str());
  KBN_CHECK(dst.shape() == src.shape(), "strided_copy: shapes differ: ", dst.str(), " vs ", src.str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  // Walk the dimensions innermost first: collapse_dims merges an inner run into the dimension outside it, so the
  // parameters are built reversed (innermost at 0) and flipped back after.
  StridedParams p{};
  p.nd = int(dst.dim());
  for (int d = 0; d < p.nd; ++d) {
    const int r = p.nd - 1 - d;
    p.shape[r] = dst.size(d);
    p.src_strides[r] = src.stride(d);
    p.dst_strides[r] = dst.stride(d);
  }
  collapse_dims(p);
  StridedParams f{};
  f.nd = p.nd;
  for (int d = 0; d < p.nd; ++d) {
    f.shape[d] = p.shape[p.nd - 1 - d];
    f.src_strides[d] = p.src_strides[p.nd - 1 - d];
    f.dst_strides[d] = p.dst_strides[p.nd - 1 - d];
  }
  if (f.nd == 0) {  // every dimension of size 1: one element
    f.nd = 1;
    f.shape[0] = 1;
    f.src_strides[0] = f.dst_strides[0] = 1;
  }
  Stream s = current_stream();
  const int64_t es = int64_t(dst.element_size());
  // 16-byte vectors when the innermost dimension is contiguous in both, a whole number of vectors, and every
  // address the copy starts a row at is 16-byte aligned.
  const int last = f.nd - 1;
  bool vec = f.src_strides[last] == 1 && f.dst_strides[last] == 1 && (f.shape[last] * es) % 16 == 0 &&
             reinterpret_cast<uintptr_t>(dst.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(src.data_ptr()) % 16 == 0;
  for (int d = 0; d < last && vec; ++d) vec = (f.src_strides[d] * es) % 16 == 0 && (f.dst_strides[d] * es) % 16 == 0;
  if (vec) {
    const int64_t per = 16 / es;  // elements per vector
    f.shape[last] /= per;
    for (int d = 0; d < last; ++d) {
      f.src_strides[d] /= per;
      f.dst_strides[d] /= per;
    }
    const int64_t nv = n / per;
    strided_copy_kernel<<<grid_for(nv), 256, 0, s>>>(static_cast<uint4*>(dst.data_ptr()),
                                                     static_cast<const uint4*>(src.data_ptr()), nv, f);
    KBN_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (es) {
    case 1:
      strided_copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint8_t*>(dst.data_ptr()),
                                                      static_cast<const uint8_t*>(src.data_ptr()), n, f);
      break;
    case 2:
      strided_copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint16_t*>(dst.data_ptr()),
                                                      static_cast<const uint16_t*>(src.data_ptr()), n, f);
      break;
    case 4:
      strided_copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint32_t*>(dst.data_ptr()),
                                                      static_cast<const uint32_t*>(src.data_ptr()), n, f);
      break;
    case 8:
      strided_copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint64_t*>(dst.data_ptr()),
                                                      static_cast<const uint64_t*>(src.data_ptr()), n, f);
      break;
    default:
      KBN_FAIL("strided_copy: unsupported element size ", dst.element_size());
  }
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace kbn::cuda
