#pragma once
// Memory for tensors. CUDA memory comes from a caching allocator: freed blocks go back to a free list
// of the stream they were allocated on and are reused by later allocations on that stream, which is safe
// without events because work on one stream is ordered. The free lists never call cudaFree during use, so
// allocation inside a CUDA-graph capture reuses cached blocks (capture-time cudaMalloc is allowed in the
// thread-local capture mode the engine uses).
#include <cstddef>

#include "kbn/device.h"

namespace kbn {

struct AllocatorStats {
  size_t allocated_bytes = 0;  // handed out to tensors now
  size_t reserved_bytes = 0;   // obtained from cudaMalloc (allocated + cached)
  size_t peak_allocated_bytes = 0;
  size_t num_device_mallocs = 0;  // cudaMalloc calls so far
  size_t num_cache_hits = 0;
};

void* cpu_alloc(size_t nbytes);
void cpu_free(void* p);

// Never returns null: throws kbn::Error naming the size and the allocator state when memory is exhausted.
void* cuda_alloc(size_t nbytes, int device, Stream stream);
void cuda_free(void* p);
AllocatorStats cuda_allocator_stats(int device);
// Returns every cached (free) block to the driver. Synchronises the device.
void cuda_empty_cache();

}  // namespace kbn
