#pragma once
// The ceilings every bench row is compared with, measured on this GPU at start-up (nothing is cached across
// runs: clocks, power state and driver change), and the device facts stamped into results.
#include <cstdint>
#include <string>

#include "kbn/dtype.h"

namespace kbn::bench {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  long long l2_bytes = 0;
  long long memory_bytes = 0;
  int clock_khz = 0;         // peak SM clock (cudaDevAttrClockRate)
  int memory_clock_khz = 0;  // peak memory clock (cudaDevAttrMemoryClockRate)
  int driver_version = 0;    // cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;   // cudaRuntimeGetVersion
};

struct Ceilings {
  double copy_gb_per_s = 0;     // device-to-device copy, bytes read + written per second / 1e9
  double read_gb_per_s = 0;     // a streaming read of 16-byte vectors (a read-only kernel outruns a copy)
  double bf16_tflop_per_s = 0;  // the baseline "linear" op at 8192 x 8192 x 8192
};

// The roofline of one GEMM shape, out[m, n] = x[m, k] w[n, k]^T (the layout of the linear op): the fastest run of any
// of the algorithms cuBLASLt's heuristic offers for it (up to 16), each run 10 times after 2 warm-ups, with the L2
// flushed before every run when `cold`. ms is 0 when no algorithm ran.
struct GemmCeiling {
  double ms = 0;
  int algorithms = 0;
};

// Needs a CUDA build and a visible GPU (the errors say which is missing).
DeviceInfo query_device(int index);
// NOTE: medians of 10 timed repetitions after warm-up: the copy moves a 2 GiB buffer (far beyond L2), the
// GEMM is square and large enough to saturate the tensor cores; both use CUDA events on the current stream.
Ceilings measure_ceilings();
GemmCeiling measure_gemm_ceiling(int64_t m, int64_t n, int64_t k, DType dtype, bool cold);

}  // namespace kbn::bench
