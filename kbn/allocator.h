#pragma once
// Memory for tensors. CUDA memory comes from a caching allocator: freed blocks go back to a free list
// of the stream they were allocated on and are reused by later allocations on that stream, which is safe
// without events because work on one stream is ordered. The free lists never call cudaFree during use, so
// allocation inside a CUDA-graph capture reuses cached blocks; a block the cache lacks is cudaMalloc'ed with the
// thread's capture mode switched to relaxed for that call (the thread-local mode the engine captures in forbids
// cudaMalloc, and the H200's long-context eval needed one).
#include <cstddef>
#include <string>
#include <vector>

#include "kbn/device.h"

namespace kbn {

struct AllocatorStats {
  size_t allocated_bytes = 0;  // handed out to tensors now
  size_t reserved_bytes = 0;   // obtained from cudaMalloc (allocated + cached)
  size_t peak_allocated_bytes = 0;
  size_t num_device_mallocs = 0;  // cudaMalloc calls so far
  size_t num_cache_hits = 0;
  size_t num_cache_flushes = 0;  // out-of-memory retries that returned the cached blocks to the driver first
};

// ---- Allocation audit (the kernel bench's validation) ----
// While an audit is active, every allocation (CPU and CUDA, any thread) is returned POISONED (every byte
// 0xFF: NaN in f32/f16/bf16, -1 in integers) and surrounded by guard zones of kAuditGuardBytes filled with a
// canary. An op that leaves part of its output unwritten leaves NaN/-1 behind; one that writes past either
// end of any buffer (its output, a scratch buffer, an in-place input the bench allocated) breaks a canary.
// Guards are verified when such a block is freed (even after the audit ended) and on demand.
constexpr size_t kAuditGuardBytes = 256;
constexpr unsigned char kAuditPoisonByte = 0xFF;

struct GuardViolation {
  size_t nbytes = 0;    // the allocation's requested size
  Device device;        // where it lives
  bool before = false;  // the zone before the buffer (else after it)
  size_t offset = 0;    // first corrupted byte, counted from the guard zone's start
  std::string describe() const;
};

class AllocationAudit {
 public:
  AllocationAudit();   // starts auditing new allocations (nesting is an error)
  ~AllocationAudit();  // stops; blocks allocated meanwhile stay guarded until freed
  AllocationAudit(const AllocationAudit&) = delete;
  AllocationAudit& operator=(const AllocationAudit&) = delete;
};

bool allocation_audit_active();
// Checks the canaries of every live audited block (synchronises CUDA devices first) and returns the
// violations found now plus those found when audited blocks were freed since the last call (then cleared).
std::vector<GuardViolation> take_guard_violations();
// Call before destroying a stream whose work has finished (kbn::OwnedStream does): blocks allocated on it
// (live, cached or audited) are re-tagged with the legacy default stream, so that a tensor outliving its
// stream (a candidate caching an output across bench cases) is later freed without touching the dead handle.
void cuda_stream_retiring(Stream stream);
// Number of live audited blocks (tests use it to see that the audit reached an allocation).
size_t audited_block_count();

void* cpu_alloc(size_t nbytes);
void cpu_free(void* p);

// Never returns null: throws kbn::Error naming the size and the allocator state when memory is exhausted.
void* cuda_alloc(size_t nbytes, int device, Stream stream);
void cuda_free(void* p);
AllocatorStats cuda_allocator_stats(int device);
// Returns every cached (free) block to the driver, except the blocks handed out during a CUDA-graph capture (a
// graph addresses them; see cuda_graph_memory_released). Synchronises each device it releases blocks of. An
// allocation that finds the device full does the same before its one retry.
void cuda_empty_cache();
// Only `device`'s cached blocks (what a tensor-parallel rank thread may release without touching the others').
void cuda_empty_cache(int device);
// The CUDA graphs captured on `device` are destroyed: the blocks handed out during their captures may be returned
// to the driver again (CudaGraphRunner's destructor calls it).
void cuda_graph_memory_released(int device);

}  // namespace kbn
