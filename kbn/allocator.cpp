#include "kbn/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kbn/error.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

namespace kbn {

void* cpu_alloc(size_t nbytes) {
  // 64-byte alignment: every vector width and cache line; zero-size allocations still get a unique pointer.
  size_t n = (nbytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  void* p = std::aligned_alloc(64, n);
  KBN_CHECK(p != nullptr, "cpu_alloc: out of host memory allocating ", nbytes, " bytes");
  return p;
}

void cpu_free(void* p) { std::free(p); }

#ifdef KBN_WITH_CUDA

namespace {

struct Block {
  void* ptr;
  size_t size;
  int device;
  Stream stream;
};

// Small requests round to 512 B, large ones to 2 MiB, so steady-state shapes map onto the same blocks.
constexpr size_t kSmall = 1 << 20;
size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n < kSmall) return (n + 511) / 512 * 512;
  return (n + (2u << 20) - 1) / (2u << 20) * (2u << 20);
}

class CachingAllocator {
 public:
  void* alloc(size_t nbytes, int device, Stream stream) {
    size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto& pool = free_[{device, stream}];
    // Best fit, but never hand out a block more than twice the request (avoids pinning a huge block).
    auto it = pool.lower_bound(size);
    if (it != pool.end() && it->first <= 2 * size) {
      Block b = it->second;
      pool.erase(it);
      stats_[device].num_cache_hits++;
      return take(b);
    }
    int prev = 0;
    KBN_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) KBN_CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached_locked(device);
      err = cudaMalloc(&p, size);
    }
    if (prev != device) cudaSetDevice(prev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      AllocatorStats& s = stats_[device];
      KBN_FAIL("cuda_alloc: out of memory on cuda:", device, " allocating ", nbytes, " bytes (", s.allocated_bytes,
               " bytes in use by tensors, ", s.reserved_bytes, " reserved): ", cudaGetErrorString(err));
    }
    AllocatorStats& s = stats_[device];
    s.reserved_bytes += size;
    s.num_device_mallocs++;
    return take(Block{p, size, device, stream});
  }

  void free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    KBN_CHECK(it != live_.end(), "cuda_free: pointer ", p, " was not allocated by the kb-nano allocator");
    Block b = it->second;
    live_.erase(it);
    stats_[b.device].allocated_bytes -= b.size;
    free_[{b.device, b.stream}].emplace(b.size, b);
  }

  AllocatorStats stats(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_[device];
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [dev, s] : stats_) release_cached_locked(dev);
  }

 private:
  void* take(const Block& b) {
    live_.emplace(b.ptr, b);
    AllocatorStats& s = stats_[b.device];
    s.allocated_bytes += b.size;
    if (s.allocated_bytes > s.peak_allocated_bytes) s.peak_allocated_bytes = s.allocated_bytes;
    return b.ptr;
  }

  void release_cached_locked(int device) {
    KBN_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [key, pool] : free_) {
      if (key.first != device) continue;
      for (auto& [size, b] : pool) {
        cudaFree(b.ptr);
        stats_[device].reserved_bytes -= b.size;
      }
      pool.clear();
    }
  }

  std::mutex mu_;
  std::map<std::pair<int, Stream>, std::multimap<size_t, Block>> free_;
  std::unordered_map<void*, Block> live_;
  std::map<int, AllocatorStats> stats_;
};

CachingAllocator& allocator() {
  // Leaked on purpose: tensors in static storage may be freed after static destructors run.
  static auto* a = new CachingAllocator();
  return *a;
}

}  // namespace

void* cuda_alloc(size_t nbytes, int device, Stream stream) { return allocator().alloc(nbytes, device, stream); }
void cuda_free(void* p) { allocator().free(p); }
AllocatorStats cuda_allocator_stats(int device) { return allocator().stats(device); }
void cuda_empty_cache() { allocator().empty_cache(); }

#else

void* cuda_alloc(size_t nbytes, int device, Stream) {
  KBN_FAIL("cuda_alloc: kb-nano was built without CUDA; cannot allocate ", nbytes, " bytes on cuda:", device);
}
void cuda_free(void*) { KBN_FAIL("cuda_free: kb-nano was built without CUDA"); }
AllocatorStats cuda_allocator_stats(int) { return {}; }
void cuda_empty_cache() {}

#endif

}  // namespace kbn
