#pragma once
// Only for translation units built with CUDA.
#include <cuda_runtime.h>

#include "kbn/error.h"

#define KBN_CUDA_CHECK(expr)                                                                                          \
  do {                                                                                                                \
    cudaError_t kbn_err_ = (expr);                                                                                    \
    if (kbn_err_ != cudaSuccess)                                                                                      \
      KBN_FAIL("CUDA error ", cudaGetErrorName(kbn_err_), " (", cudaGetErrorString(kbn_err_), ") in ", #expr, " at ", \
               __FILE__, ":", __LINE__);                                                                              \
  } while (0)

// After a kernel launch: catches launch-configuration errors immediately (not asynchronous faults).
#define KBN_CUDA_CHECK_LAUNCH() KBN_CUDA_CHECK(cudaGetLastError())
