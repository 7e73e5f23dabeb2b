#pragma once
// Element-wise comparison of two tensors on their own device (the kernel bench compares outputs of
// hundreds of MB; copying them to the host as doubles would dominate its run time).
#include <cstdint>
#include <string>

#include "kbn/tensor.h"

namespace kbn {

// An element passes when |actual - expected| <= atol + rtol * |expected|, where
// atol = atol_rms * rms(expected) + atol_abs. Scaling atol by the output's rms keeps one tolerance valid for
// outputs of any magnitude while still judging elements that cancel to near zero against the output's scale.
// Integer and bool tensors, and rtol = atol_rms = atol_abs = 0, compare exactly.
struct Tolerance {
  double rtol = 0;
  double atol_rms = 0;
  double atol_abs = 0;
  bool exact() const { return rtol == 0 && atol_rms == 0 && atol_abs == 0; }
};

// The validation tolerance of an output of `dtype` (about two ulps of it): bf16 1.6e-2, f16 2e-3, else 1e-4, as
// rtol and atol_rms both. An op whose outputs need another declares it in its entry (OpEntry::tolerance).
Tolerance dtype_tolerance(DType dtype);

struct CompareStats {
  int64_t numel = 0;
  int64_t bad = 0;         // elements outside the tolerance (NaN in either counts as bad)
  int64_t first_bad = -1;  // flat index (row-major over the shape) of the first bad element
  int64_t nan_actual = 0;  // NaN elements in `actual` (integers: never)
  int64_t first_nan_actual = -1;
  int64_t nan_expected = 0;
  double max_abs_err = 0;  // over elements where both are finite
  double sum_abs_err = 0;
  double sum_abs_expected = 0;
  double sum_sq_expected = 0;
  double actual_at_first_bad = 0, expected_at_first_bad = 0;

  double rms_expected() const;
  double mean_rel_err() const;   // sum |a - e| / sum |e| (0 when both are 0)
  std::string describe() const;  // "3 of 4096 elements outside tolerance, first at [1, 7]: 0.51 vs 0.47; ..."
};

// Same shape and dtype required (the error names both); any strides; runs on the tensors' device.
CompareStats compare_close(const Tensor& actual, const Tensor& expected, const Tolerance& tol);

// Bytes that differ between two tensors of the same shape and dtype (bitwise, NaN payloads included);
// `first` receives the flat element index of the first difference, or -1.
int64_t count_bitwise_mismatches(const Tensor& a, const Tensor& b, int64_t* first = nullptr);

// Elements whose every byte equals `byte` (the allocation audit's poison: NaN / -1), and the first one.
int64_t count_poisoned(const Tensor& t, unsigned char byte, int64_t* first = nullptr);

// "[1, 7]" for flat index 15 of shape [2, 8].
std::string unravel_index(const Shape& shape, int64_t flat);

}  // namespace kbn
