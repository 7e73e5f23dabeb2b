// The registry behind kernel-recorded errors (kbn/device_errors.h). The record itself is host-mapped GPU memory:
// its path from a kernel to an exception is tested on the GPU (tests/gpu/test_moe_gpu.cpp, NaN router logits).
#include <gtest/gtest.h>

#include "kbn/device_errors.h"

namespace kbn {
namespace {

TEST(DeviceErrors, CodesAreStablePerMessage) {
  const int32_t a = device_error_code("test: argument 'x' holds NaN in row {detail}");
  const int32_t b = device_error_code("test: argument 'y' holds Inf in row {detail}");
  EXPECT_GT(a, 0);
  EXPECT_GT(b, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(device_error_code("test: argument 'x' holds NaN in row {detail}"), a);
}

TEST(DeviceErrors, NothingRecordedRaisesNothing) {
  // No kernel path has asked for the record in this process: the check reads nothing and allocates nothing.
  EXPECT_NO_THROW(check_device_errors());
}

}  // namespace
}  // namespace kbn
