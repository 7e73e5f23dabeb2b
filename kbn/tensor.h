#pragma once
// kbn::Tensor: refcounted storage + dtype + shape + strides (in elements) + offset (in elements) + device.
// Views share storage; nothing here launches a kernel except copies and fills.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kbn/device.h"
#include "kbn/dtype.h"
#include "kbn/error.h"

namespace kbn {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Storage {
 public:
  // Takes ownership of `data`; `deleter` releases it.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  std::function<void(void*)> deleter_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (defined() == false)

  // Uninitialised memory. CUDA memory comes from the caching allocator, ordered on current_stream().
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  // Wraps memory owned elsewhere (no ownership taken); the caller keeps it alive.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device);
  // CPU tensor from host values, converted to `dtype` (floats round to nearest even).
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32);
  static Tensor from_i32(const std::vector<int32_t>& values, const Shape& shape);
  static Tensor from_i64(const std::vector<int64_t>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_.is_cpu(); }
  bool is_cuda() const { return device_.is_cuda(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;  // negative d counts from the end
  int64_t offset() const { return offset_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data_ptr() const;
  // Typed pointer; the error names the tensor's dtype when T does not match it.
  template <class T>
  T* data() const;

  // Views (share storage).
  Tensor view(const Shape& shape) const;  // needs a contiguous tensor; one dimension may be -1
  Tensor slice(int64_t d, int64_t start, int64_t end) const;
  Tensor select(int64_t d, int64_t index) const;  // removes dimension d
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;
  // View with another dtype of the same element size (e.g. bf16 bits as i16-like u16 pairs).
  Tensor view_dtype(DType dtype) const;

  // Copies.
  Tensor reshape(const Shape& shape) const;  // view when possible
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;  // floating dtypes convert on the device; others through the CPU
  // Copies src into this tensor (same shape; any devices; dtype conversion only between CPU tensors).
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_() { fill_(0.0); }

  // Host conversions for tests and the oracle (any device, any strides).
  std::vector<float> to_floats() const;  // floating dtypes; integers converted exactly when |v| < 2^24
  std::vector<double> to_doubles() const;
  std::vector<int64_t> to_ints() const;  // integer and bool dtypes

  // "bf16[4, 4096] cuda:0" (+ " strides=[...]" when not contiguous).
  std::string str() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, int64_t offset, Device device);

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  Device device_;
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<fp8e4m3_t> {
  static constexpr DType value = DType::fp8e4m3;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};

template <class T>
T* Tensor::data() const {
  if constexpr (!std::is_void_v<T>) {
    KBN_CHECK(dtype_of<std::remove_const_t<T>>::value == dtype_, "Tensor::data<",
              dtype_name(dtype_of<std::remove_const_t<T>>::value), ">: tensor is ", str());
  }
  return static_cast<T*>(data_ptr());
}

// Allocate-and-copy between devices without a Tensor (used by the loader and tests).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
// Blocks until all work on the current stream of `device` is done (no-op on CPU).
void synchronize(Device device);

}  // namespace kbn
