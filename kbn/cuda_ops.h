#pragma once
// Device-side helpers behind Tensor (copies, fills, conversions). Defined in kbn/tensor_kernels.cu when
// built with CUDA; without CUDA no CUDA tensor can exist, and these refuse with a clear error.
#include <cstdint>
#include <utility>
#include <vector>

#include "kbn/dtype.h"

namespace kbn {
class Tensor;
namespace cuda {
// dst[i] = convert(src[i]) for floating dtypes; both contiguous, on `device`'s current stream.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, int device);
// Same dtype, same device, any strides (rank <= 8).
void strided_copy(const Tensor& dst, const Tensor& src);
void fill(void* dst, DType dtype, int64_t n, double value, int device);
// dst[i] = i for i < n (i32, a device array), on the current stream.
void iota_i32(int32_t* dst, int64_t n);
// dst[pairs[k].first] = src[pairs[k].second] for every k: i64 elements of two device arrays, on the current stream. The
// pairs travel as kernel parameters (no upload); a long list takes several launches.
void copy_indexed_i64(int64_t* dst, const int64_t* src, const std::vector<std::pair<int32_t, int32_t>>& pairs);
}  // namespace cuda
}  // namespace kbn
