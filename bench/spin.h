#pragma once
// A kernel that keeps a stream busy for a given time: the timing loop's calibration of the host round trip.
#ifdef KBN_WITH_CUDA
#include <cuda_runtime.h>

namespace kbn::bench {

// Enqueues one single-thread block on `stream` that spins on the GPU's global timer until `ms` milliseconds have
// passed since it started (0 or less: returns at once). The device is otherwise idle for it: it reads and writes no
// memory.
void spin_on_device(double ms, cudaStream_t stream);

}  // namespace kbn::bench
#endif  // KBN_WITH_CUDA
