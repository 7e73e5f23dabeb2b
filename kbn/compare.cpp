#include "kbn/compare.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kbn/checks.h"
#include "kbn/error.h"

namespace kbn {

Tolerance dtype_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return {1.6e-2, 1.6e-2, 0};
    case DType::f16:
      return {2e-3, 2e-3, 0};
    default:
      return {1e-4, 1e-4, 0};
  }
}

#ifdef KBN_WITH_CUDA
namespace cuda {
// Defined in kbn/compare_kernels.cu; both tensors contiguous, same dtype, on one CUDA device.
CompareStats compare_close(const Tensor& actual, const Tensor& expected, const Tolerance& tol);
int64_t count_bitwise_mismatches(const Tensor& a, const Tensor& b, int64_t* first);
int64_t count_poisoned(const Tensor& t, unsigned char byte, int64_t* first);
}  // namespace cuda
#endif

double CompareStats::rms_expected() const { return numel ? std::sqrt(sum_sq_expected / double(numel)) : 0.0; }

double CompareStats::mean_rel_err() const {
  if (sum_abs_expected == 0) return sum_abs_err == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return sum_abs_err / sum_abs_expected;
}

std::string unravel_index(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t n = shape[d] > 0 ? shape[d] : 1;
    idx[d] = flat % n;
    flat /= n;
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

std::string CompareStats::describe() const {
  std::ostringstream os;
  os.precision(4);
  if (bad == 0) {
    os << "max |err| " << max_abs_err << ", mean rel err " << mean_rel_err() << " over " << numel << " elements";
    return os.str();
  }
  os << bad << " of " << numel << " elements outside tolerance (first at flat index " << first_bad << ": "
     << actual_at_first_bad << " vs " << expected_at_first_bad << ")";
  if (nan_actual) os << "; " << nan_actual << " NaN";
  os << "; max |err| " << max_abs_err << ", rms(expected) " << rms_expected();
  return os.str();
}

namespace {

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  KBN_CHECK(a.defined() && b.defined(), op, ": both tensors must be defined");
  KBN_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device(), op,
            ": expected tensors of one shape, dtype and device, got ", a.str(), " and ", b.str());
}

double atol_of(const Tolerance& tol, double rms) { return tol.atol_abs + tol.atol_rms * rms; }

CompareStats compare_cpu(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
  CompareStats s;
  s.numel = actual.numel();
  auto record_bad = [&](int64_t i, double a, double e) {
    if (s.bad++ == 0) {
      s.first_bad = i;
      s.actual_at_first_bad = a;
      s.expected_at_first_bad = e;
    }
  };
  if (!is_floating(actual.dtype())) {
    const auto a = actual.to_ints(), e = expected.to_ints();
    for (size_t i = 0; i < a.size(); ++i) {
      const double err = std::abs(double(a[i]) - double(e[i]));
      s.max_abs_err = std::max(s.max_abs_err, err);
      s.sum_abs_err += err;
      s.sum_abs_expected += std::abs(double(e[i]));
      s.sum_sq_expected += double(e[i]) * double(e[i]);
      if (a[i] != e[i]) record_bad(int64_t(i), double(a[i]), double(e[i]));
    }
    return s;
  }
  const auto a = actual.to_doubles(), e = expected.to_doubles();
  for (size_t i = 0; i < e.size(); ++i)
    if (!std::isnan(e[i])) s.sum_sq_expected += e[i] * e[i];
  const double atol = atol_of(tol, s.rms_expected());
  for (size_t i = 0; i < a.size(); ++i) {
    const bool na = std::isnan(a[i]), ne = std::isnan(e[i]);
    if (na && s.nan_actual++ == 0) s.first_nan_actual = int64_t(i);
    if (ne) s.nan_expected++;
    if (na || ne) {
      record_bad(int64_t(i), a[i], e[i]);
      continue;
    }
    const double err = std::abs(a[i] - e[i]);
    const bool ok = tol.exact() ? a[i] == e[i] : err <= atol + tol.rtol * std::abs(e[i]);
    if (std::isfinite(err)) {
      s.max_abs_err = std::max(s.max_abs_err, err);
      s.sum_abs_err += err;
    }
    s.sum_abs_expected += std::abs(e[i]);
    if (!ok) record_bad(int64_t(i), a[i], e[i]);
  }
  return s;
}

}  // namespace

CompareStats compare_close(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
  check_pair(actual, expected, "compare_close");
  if (actual.is_cuda()) {
#ifdef KBN_WITH_CUDA
    return cuda::compare_close(actual.contiguous(), expected.contiguous(), tol);
#endif
  }
  return compare_cpu(actual, expected, tol);
}

int64_t count_bitwise_mismatches(const Tensor& a, const Tensor& b, int64_t* first) {
  check_pair(a, b, "count_bitwise_mismatches");
  if (first) *first = -1;
  if (a.is_cuda()) {
#ifdef KBN_WITH_CUDA
    return cuda::count_bitwise_mismatches(a.contiguous(), b.contiguous(), first);
#endif
  }
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const auto* pa = static_cast<const unsigned char*>(ca.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(cb.data_ptr());
  const size_t es = a.element_size();
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + size_t(i) * es, pb + size_t(i) * es, es) != 0) {
      if (n++ == 0 && first) *first = i;
    }
  }
  return n;
}

int64_t count_poisoned(const Tensor& t, unsigned char byte, int64_t* first) {
  KBN_CHECK(t.defined(), "count_poisoned: tensor must be defined");
  if (first) *first = -1;
  if (t.is_cuda()) {
#ifdef KBN_WITH_CUDA
    return cuda::count_poisoned(t.contiguous(), byte, first);
#endif
  }
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t es = t.element_size();
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    bool all = true;
    for (size_t k = 0; k < es && all; ++k) all = p[size_t(i) * es + k] == byte;
    if (all && n++ == 0 && first) *first = i;
  }
  return n;
}

}  // namespace kbn
