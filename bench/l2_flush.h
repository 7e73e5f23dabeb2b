#pragma once
// The cold-L2 flush of `kb_nano kernels --mode cold`, run before each timed call, outside its events.
#ifdef KBN_WITH_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kbn::bench {

// Reads `bytes` (a multiple of 16) at `buf` with a read-only kernel, so that the L2 afterwards holds clean lines of
// the buffer and nothing of the timed call's inputs. A flush that writes (cudaMemset) leaves the L2 full of dirty
// lines, and the timed call would pay for writing them back to DRAM as its own misses evict them: up to 60 MB of
// writes that are not the kernel's, which made a 64 MB memory-bound kernel look ~15% slower. The dirty lines of
// earlier work are written back here, during the flush. `sink` (4 bytes of device memory) receives a value the
// loads depend on, so they cannot be elided.
void flush_l2_by_reading(const void* buf, size_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace kbn::bench
#endif  // KBN_WITH_CUDA
