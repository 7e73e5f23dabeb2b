#include "kbn/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "kbn/allocator.h"
#include "kbn/cuda_ops.h"

namespace kbn {

namespace detail {
void throw_error(const char* file, int line, const std::string& msg) {
  (void)file;
  (void)line;
  throw Error(msg);
}
}  // namespace detail

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = acc;
    acc *= std::max<int64_t>(s[size_t(i)], 1);
  }
  return st;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, int64_t offset, Device device)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      device_(device) {}

static void check_shape_valid(const Shape& shape, const char* what) {
  for (int64_t d : shape) KBN_CHECK(d >= 0, what, ": shape must have non-negative sizes, got ", shape_str(shape));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape_valid(shape, "Tensor::empty");
  size_t nbytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<Storage> st;
  if (device.is_cpu()) {
    st = std::make_shared<Storage>(cpu_alloc(nbytes), nbytes, device, [](void* p) { cpu_free(p); });
  } else {
    st = std::make_shared<Storage>(cuda_alloc(nbytes, device.index, current_stream()), nbytes, device,
                                   [](void* p) { cuda_free(p); });
  }
  return Tensor(std::move(st), dtype, shape, contiguous_strides(shape), 0, device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  check_shape_valid(shape, "Tensor::from_blob");
  size_t nbytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  auto st = std::make_shared<Storage>(data, nbytes, device, nullptr);
  return Tensor(std::move(st), dtype, shape, contiguous_strides(shape), 0, device);
}

namespace {

// Host element access in double precision, for conversions and the oracle's input path.
double load_as_double(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f16:
      return f16_to_float(static_cast<const f16_t*>(base)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const bf16_t*>(base)[i]);
    case DType::fp8e4m3:
      return fp8e4m3_to_float(static_cast<const fp8e4m3_t*>(base)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(base)[i];
    case DType::i64:
      return double(static_cast<const int64_t*>(base)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::boolean:
      return static_cast<const uint8_t*>(base)[i] ? 1.0 : 0.0;
  }
  return 0;
}

void store_from_double(void* base, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::f32:
      static_cast<float*>(base)[i] = float(v);
      return;
    case DType::f16:
      static_cast<f16_t*>(base)[i] = float_to_f16(float(v));
      return;
    case DType::bf16:
      static_cast<bf16_t*>(base)[i] = float_to_bf16(float(v));
      return;
    case DType::fp8e4m3:
      static_cast<fp8e4m3_t*>(base)[i] = float_to_fp8e4m3(float(v));
      return;
    case DType::i32:
      static_cast<int32_t*>(base)[i] = int32_t(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(base)[i] = int64_t(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(base)[i] = uint8_t(v);
      return;
    case DType::boolean:
      static_cast<uint8_t*>(base)[i] = v != 0.0;
      return;
  }
}

// Calls f(linear_index, element_offset) over a strided view in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, F&& f) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = offset;
  for (int64_t li = 0; li < n; ++li) {
    f(li, off);
    for (int64_t d = int64_t(nd) - 1; d >= 0; --d) {
      size_t ud = size_t(d);
      if (++idx[ud] < shape[ud]) {
        off += strides[ud];
        break;
      }
      off -= strides[ud] * (shape[ud] - 1);
      idx[ud] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  KBN_CHECK(int64_t(values.size()) == shape_numel(shape), "Tensor::from_floats: ", values.size(),
            " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.data_ptr(), dtype, int64_t(i), values[i]);
  return t;
}

Tensor Tensor::from_i32(const std::vector<int32_t>& values, const Shape& shape) {
  KBN_CHECK(int64_t(values.size()) == shape_numel(shape), "Tensor::from_i32: ", values.size(),
            " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, DType::i32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::from_i64(const std::vector<int64_t>& values, const Shape& shape) {
  KBN_CHECK(int64_t(values.size()) == shape_numel(shape), "Tensor::from_i64: ", values.size(),
            " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, DType::i64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 8);
  return t;
}

static int64_t wrap_dim(int64_t d, int64_t nd, const char* what) {
  int64_t w = d < 0 ? d + nd : d;
  KBN_CHECK(w >= 0 && w < nd, what, ": dimension ", d, " out of range for a ", nd, "-D tensor");
  return w;
}

int64_t Tensor::size(int64_t d) const { return shape_[size_t(wrap_dim(d, dim(), "Tensor::size"))]; }
int64_t Tensor::stride(int64_t d) const { return strides_[size_t(wrap_dim(d, dim(), "Tensor::stride"))]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[size_t(i)] == 1) continue;
    if (strides_[size_t(i)] != expected) return false;
    expected *= shape_[size_t(i)];
  }
  return true;
}

void* Tensor::data_ptr() const {
  KBN_CHECK(defined(), "Tensor::data_ptr: tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(element_size());
}

Tensor Tensor::view(const Shape& shape) const {
  KBN_CHECK(is_contiguous(), "Tensor::view: needs a contiguous tensor, got ", str(), " (use reshape)");
  Shape s = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      KBN_CHECK(infer < 0, "Tensor::view: only one dimension may be -1, got ", shape_str(shape));
      infer = int64_t(i);
    } else {
      KBN_CHECK(s[i] >= 0, "Tensor::view: invalid size in ", shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    KBN_CHECK(known > 0 && numel() % known == 0, "Tensor::view: cannot view ", str(), " as ", shape_str(shape));
    s[size_t(infer)] = numel() / known;
  }
  KBN_CHECK(shape_numel(s) == numel(), "Tensor::view: cannot view ", str(), " as ", shape_str(shape),
            " (element counts differ)");
  return Tensor(storage_, dtype_, s, contiguous_strides(s), offset_, device_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  int64_t w = wrap_dim(d, dim(), "Tensor::slice");
  int64_t n = shape_[size_t(w)];
  KBN_CHECK(0 <= start && start <= end && end <= n, "Tensor::slice: range [", start, ", ", end,
            ") out of bounds for dimension ", d, " of ", str());
  Shape s = shape_;
  s[size_t(w)] = end - start;
  return Tensor(storage_, dtype_, s, strides_, offset_ + start * strides_[size_t(w)], device_);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  int64_t w = wrap_dim(d, dim(), "Tensor::select");
  KBN_CHECK(index >= 0 && index < shape_[size_t(w)], "Tensor::select: index ", index, " out of bounds for dimension ",
            d, " of ", str());
  Shape s = shape_, st = strides_;
  int64_t off = offset_ + index * strides_[size_t(w)];
  s.erase(s.begin() + w);
  st.erase(st.begin() + w);
  return Tensor(storage_, dtype_, s, st, off, device_);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t a = wrap_dim(d0, dim(), "Tensor::transpose"), b = wrap_dim(d1, dim(), "Tensor::transpose");
  Shape s = shape_, st = strides_;
  std::swap(s[size_t(a)], s[size_t(b)]);
  std::swap(st[size_t(a)], st[size_t(b)]);
  return Tensor(storage_, dtype_, s, st, offset_, device_);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  int64_t w = d < 0 ? d + dim() + 1 : d;
  KBN_CHECK(w >= 0 && w <= dim(), "Tensor::unsqueeze: dimension ", d, " out of range for ", str());
  Shape s = shape_, st = strides_;
  int64_t stride = w < dim() ? strides_[size_t(w)] * shape_[size_t(w)] : 1;
  s.insert(s.begin() + w, 1);
  st.insert(st.begin() + w, stride);
  return Tensor(storage_, dtype_, s, st, offset_, device_);
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  KBN_CHECK(shape.size() == strides.size(), "Tensor::as_strided: shape ", shape_str(shape), " and strides ",
            shape_str(strides), " differ in rank");
  int64_t max_off = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    KBN_CHECK(shape[i] >= 0 && strides[i] >= 0, "Tensor::as_strided: negative size or stride");
    if (shape[i] > 0) max_off += (shape[i] - 1) * strides[i];
  }
  KBN_CHECK(offset >= 0 && (shape_numel(shape) == 0 || size_t(max_off + 1) * element_size() <= storage_->nbytes()),
            "Tensor::as_strided: view ", shape_str(shape), " strides ", shape_str(strides), " offset ", offset,
            " exceeds the storage of ", storage_->nbytes(), " bytes");
  return Tensor(storage_, dtype_, shape, strides, offset, device_);
}

Tensor Tensor::view_dtype(DType dtype) const {
  KBN_CHECK(dtype_size(dtype) == element_size(), "Tensor::view_dtype: ", dtype_name(dtype), " and ", dtype_name(dtype_),
            " differ in element size");
  return Tensor(storage_, dtype, shape_, strides_, offset_, device_);
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device_);
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  KBN_CHECK(defined() && src.defined(), "Tensor::copy_: both tensors must be defined");
  KBN_CHECK(shape_ == src.shape_, "Tensor::copy_: destination ", str(), " and source ", src.str(), " differ in shape");
  if (numel() == 0) return;
  if (is_cpu() && src.is_cpu()) {
    if (dtype_ == src.dtype_ && is_contiguous() && src.is_contiguous()) {
      std::memmove(data_ptr(), src.data_ptr(), nbytes());
      return;
    }
    // Gather the source in row-major order, then scatter into the destination.
    std::vector<double> vals(static_cast<size_t>(numel()));
    const void* sb = static_cast<const char*>(src.storage_->data());
    for_each_offset(src.shape_, src.strides_, src.offset_,
                    [&](int64_t li, int64_t off) { vals[size_t(li)] = load_as_double(sb, src.dtype_, off); });
    if (dtype_ == src.dtype_ && element_size() > 0) {
      // Same dtype: copy raw bits so NaN payloads and -0 survive exactly.
      size_t es = element_size();
      std::vector<char> raw(static_cast<size_t>(numel()) * es);
      for_each_offset(src.shape_, src.strides_, src.offset_, [&](int64_t li, int64_t off) {
        std::memcpy(raw.data() + size_t(li) * es, static_cast<const char*>(sb) + size_t(off) * es, es);
      });
      char* db = static_cast<char*>(storage_->data());
      for_each_offset(shape_, strides_, offset_, [&](int64_t li, int64_t off) {
        std::memcpy(db + size_t(off) * es, raw.data() + size_t(li) * es, es);
      });
      return;
    }
    void* db = storage_->data();
    for_each_offset(shape_, strides_, offset_,
                    [&](int64_t li, int64_t off) { store_from_double(db, dtype_, off, vals[size_t(li)]); });
    return;
  }
  // At least one side is on a GPU.
  if (dtype_ != src.dtype_) {
    if (is_cuda() && src.is_cuda() && is_contiguous() && src.is_contiguous() && is_floating(dtype_) &&
        is_floating(src.dtype_)) {
      cuda::convert(src.data_ptr(), src.dtype_, data_ptr(), dtype_, numel(), device_.index);
      return;
    }
    Tensor tmp = empty(shape_, src.dtype_, device_);  // move first, then convert on this device
    tmp.copy_(src);
    Tensor conv = is_cpu() ? tmp.to(dtype_) : tmp.to(Device::cpu()).to(dtype_).to(device_);
    copy_(conv);
    return;
  }
  if (is_contiguous() && src.is_contiguous()) {
    copy_bytes(data_ptr(), device_, src.data_ptr(), src.device_, nbytes());
    return;
  }
  if (is_cuda() && src.is_cuda()) {
    KBN_CHECK(device_ == src.device_, "Tensor::copy_: strided copy between two GPUs needs a contiguous source");
    cuda::strided_copy(*this, src);
    return;
  }
  // Host <-> device with a strided side: make both contiguous on their own device first.
  Tensor s = src.contiguous();
  if (is_contiguous()) {
    copy_bytes(data_ptr(), device_, s.data_ptr(), s.device_, nbytes());
  } else {
    Tensor tmp = empty(shape_, dtype_, device_);
    copy_bytes(tmp.data_ptr(), device_, s.data_ptr(), s.device_, nbytes());
    copy_(tmp);
  }
}

void Tensor::fill_(double value) {
  KBN_CHECK(defined(), "Tensor::fill_: tensor is undefined");
  if (numel() == 0) return;
  if (is_cuda()) {
    KBN_CHECK(is_contiguous(), "Tensor::fill_: CUDA fill needs a contiguous tensor, got ", str());
    cuda::fill(data_ptr(), dtype_, numel(), value, device_.index);
    return;
  }
  void* base = storage_->data();
  for_each_offset(shape_, strides_, offset_,
                  [&](int64_t, int64_t off) { store_from_double(base, dtype_, off, value); });
}

std::vector<double> Tensor::to_doubles() const {
  KBN_CHECK(defined(), "Tensor::to_doubles: tensor is undefined");
  Tensor h = is_cpu() ? *this : to(Device::cpu());
  std::vector<double> out(static_cast<size_t>(h.numel()));
  const void* base = h.storage_->data();
  for_each_offset(h.shape_, h.strides_, h.offset_,
                  [&](int64_t li, int64_t off) { out[size_t(li)] = load_as_double(base, h.dtype_, off); });
  return out;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<double> d = to_doubles();
  return std::vector<float>(d.begin(), d.end());
}

std::vector<int64_t> Tensor::to_ints() const {
  KBN_CHECK(!is_floating(dtype_), "Tensor::to_ints: needs an integer or bool tensor, got ", str());
  Tensor h = is_cpu() ? *this : to(Device::cpu());
  std::vector<int64_t> out(static_cast<size_t>(h.numel()));
  const char* base = static_cast<const char*>(h.storage_->data());
  DType dt = h.dtype_;
  for_each_offset(h.shape_, h.strides_, h.offset_, [&](int64_t li, int64_t off) {
    int64_t v = 0;
    switch (dt) {
      case DType::i32:
        v = reinterpret_cast<const int32_t*>(base)[off];
        break;
      case DType::i64:
        v = reinterpret_cast<const int64_t*>(base)[off];
        break;
      default:
        v = reinterpret_cast<const uint8_t*>(base)[off];
        break;
    }
    out[size_t(li)] = v;
  });
  return out;
}

std::string Tensor::str() const {
  if (!defined()) return "<undefined tensor>";
  std::ostringstream os;
  os << dtype_name(dtype_) << shape_str(shape_) << " " << device_.str();
  if (!is_contiguous()) os << " strides=" << shape_str(strides_);
  return os.str();
}

}  // namespace kbn
