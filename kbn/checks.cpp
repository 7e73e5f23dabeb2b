#include "kbn/checks.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

namespace kbn {

void check_defined(const Tensor& t, const char* op, const char* arg) {
  KBN_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_cpu(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  KBN_CHECK(t.is_cpu(), op, ": argument '", arg, "' must be a CPU tensor (the reference runs on the host), got ",
            t.str());
}

void check_rank(const Tensor& t, const char* op, const char* arg, int64_t rank, const char* layout) {
  check_defined(t, op, arg);
  KBN_CHECK(t.dim() == rank, op, ": argument '", arg, "' must be ", rank, "-D ", layout, ", got ", t.str());
}

void check_dtype(const Tensor& t, const char* op, const char* arg, std::initializer_list<DType> allowed) {
  check_defined(t, op, arg);
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::ostringstream os;
  bool first = true;
  for (DType d : allowed) {
    os << (first ? "" : ", ") << dtype_name(d);
    first = false;
  }
  KBN_FAIL(op, ": argument '", arg, "' must have dtype in {", os.str(), "}, got ", t.str());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* arg_a, const char* arg_b) {
  KBN_CHECK(a.dtype() == b.dtype(), op, ": arguments '", arg_a, "' and '", arg_b, "' must have the same dtype, got ",
            a.str(), " and ", b.str());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* arg_a, const char* arg_b) {
  KBN_CHECK(a.device() == b.device(), op, ": arguments '", arg_a, "' and '", arg_b,
            "' must be on the same device, got ", a.str(), " and ", b.str());
}

void check_contiguous(const Tensor& t, const char* op, const char* arg) {
  KBN_CHECK(t.is_contiguous(), op, ": argument '", arg, "' must be contiguous, got ", t.str());
}

void check_last_dim_contiguous(const Tensor& t, const char* op, const char* arg) {
  KBN_CHECK(t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, op, ": argument '", arg,
            "' must have a contiguous last dimension (stride 1), got ", t.str());
}

void check_size(const Tensor& t, const char* op, const char* arg, int64_t dim, int64_t expected, const char* what) {
  KBN_CHECK(t.size(dim) == expected, op, ": argument '", arg, "' dimension ", dim, " (", what, ") must be ", expected,
            ", got ", t.str());
}

void check_aligned(const Tensor& t, const char* op, const char* arg, size_t bytes) {
  auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  bool ok = addr % bytes == 0;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != 1) ok = ok && (size_t(t.stride(d)) * t.element_size()) % bytes == 0;
  KBN_CHECK(ok, op, ": argument '", arg, "' must be ", bytes, "-byte aligned (data pointer and row strides), got ",
            t.str());
}

void check_distinct_slots(const Tensor& indices, const char* op, const char* arg, int64_t num_slots) {
  const std::vector<int64_t> idx = indices.to_ints();
  std::vector<bool> used(size_t(std::max<int64_t>(num_slots, 0)), false);
  for (size_t i = 0; i < idx.size(); ++i) {
    KBN_CHECK(idx[i] >= 0 && idx[i] < num_slots, op, ": argument '", arg, "'[", i, "] = ", idx[i],
              " is not a slot in [0, ", num_slots, ")");
    KBN_CHECK(!used[size_t(idx[i])], op, ": argument '", arg, "' holds slot ", idx[i],
              " twice (sequences need distinct slots)");
    used[size_t(idx[i])] = true;
  }
}

}  // namespace kbn
