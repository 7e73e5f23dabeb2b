#include "kbn/allocator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kbn/error.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

namespace kbn {

namespace {
void* raw_cpu_alloc(size_t nbytes) {
  // 64-byte alignment: every vector width and cache line; zero-size allocations still get a unique pointer.
  size_t n = (nbytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  void* p = std::aligned_alloc(64, n);
  KBN_CHECK(p != nullptr, "cpu_alloc: out of host memory allocating ", nbytes, " bytes");
  return p;
}

void raw_cpu_free(void* p) { std::free(p); }
}  // namespace

#ifdef KBN_WITH_CUDA

namespace {

struct Block {
  void* ptr;
  size_t size;
  int device;
  Stream stream;
  // Handed out during a CUDA-graph capture: a graph addresses it, so it is never returned to the driver until
  // cuda_graph_memory_released() says the graphs are gone (a replay into unmapped memory faults).
  bool graph = false;
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
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) cudaGetLastError();
    const bool for_graph = capture != cudaStreamCaptureStatusNone;
    auto& pool = free_[{device, stream}];
    // Best fit, but never hand out a block more than twice the request (avoids pinning a huge block).
    auto it = pool.lower_bound(size);
    if (it != pool.end() && it->first <= 2 * size) {
      Block b = it->second;
      pool.erase(it);
      stats_[device].num_cache_hits++;
      b.graph = b.graph || for_graph;
      return take(b);
    }
    int prev = 0;
    KBN_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) KBN_CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    // cudaMalloc is an "unsafe" call inside a stream capture in the global and thread-local modes (the engine
    // captures its decode graphs in thread-local mode, so that host syncs fail the capture): the malloc itself
    // runs in relaxed mode, like PyTorch's allocator does. The block is then a cached block of this stream that
    // eager steps may use between replays (see cuda_graph_runner.cpp for why sharing it with the graphs is safe),
    // marked as the graphs' so that it is never freed under them.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !for_graph) {
      // Out of memory outside a capture: hand the cached blocks back to the driver (all but the graphs') and try
      // once more (not during a capture, where the device-wide sync this needs is not allowed).
      cudaGetLastError();
      release_cached_locked(device);
      stats_[device].num_cache_flushes++;
      err = cudaMalloc(&p, size);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (prev != device) cudaSetDevice(prev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      AllocatorStats& s = stats_[device];
      KBN_FAIL("cuda_alloc: ", err == cudaErrorMemoryAllocation ? "out of memory" : "cudaMalloc failed", " on cuda:",
               device, " allocating ", nbytes, " bytes (", s.allocated_bytes, " bytes in use by tensors, ",
               s.reserved_bytes, " reserved", capture != cudaStreamCaptureStatusNone ? ", during a graph capture" : "",
               "): ", cudaGetErrorString(err));
    }
    AllocatorStats& s = stats_[device];
    s.reserved_bytes += size;
    s.num_device_mallocs++;
    return take(Block{p, size, device, stream, for_graph});
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

  // `stream` is about to be destroyed (its work has finished): blocks tagged with it, live or cached, move to
  // the legacy default stream's tag, so that no free list keys on a dead handle that a new stream may reuse.
  void retire_stream(Stream stream) {
    if (stream == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, b] : live_)
      if (b.stream == stream) b.stream = nullptr;
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.second != stream) {
        ++it;
        continue;
      }
      auto& to = free_[{it->first.first, nullptr}];
      for (auto& [size, b] : it->second) {
        b.stream = nullptr;
        to.emplace(size, b);
      }
      it = free_.erase(it);
    }
  }

  AllocatorStats stats(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_[device];
  }

  // The graphs that addressed `device`'s graph blocks are destroyed: those blocks become ordinary cached blocks.
  void graph_memory_released(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, b] : live_)
      if (b.device == device) b.graph = false;
    for (auto& [key, pool] : free_)
      if (key.first == device)
        for (auto& [size, b] : pool) b.graph = false;
  }

  void empty_cache(int only_device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [dev, s] : stats_)
      if (only_device < 0 || dev == only_device) release_cached_locked(dev);
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
    {
      // The device whose blocks are released must have finished with them (not merely the caller's current one).
      const DeviceGuard on(Device::cuda(device));
      KBN_CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (auto& [key, pool] : free_) {
      if (key.first != device) continue;
      for (auto it = pool.begin(); it != pool.end();) {
        if (it->second.graph) {  // a live CUDA graph addresses it
          ++it;
          continue;
        }
        cudaFree(it->second.ptr);
        stats_[device].reserved_bytes -= it->second.size;
        it = pool.erase(it);
      }
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

namespace {
void* raw_cuda_alloc(size_t nbytes, int device, Stream stream) { return allocator().alloc(nbytes, device, stream); }
void raw_cuda_free(void* p) { allocator().free(p); }
void raw_retire_stream(Stream s) { allocator().retire_stream(s); }
}  // namespace
AllocatorStats cuda_allocator_stats(int device) { return allocator().stats(device); }
void cuda_empty_cache() { allocator().empty_cache(-1); }
void cuda_empty_cache(int device) { allocator().empty_cache(device); }
void cuda_graph_memory_released(int device) { allocator().graph_memory_released(device); }

#else

namespace {
void* raw_cuda_alloc(size_t nbytes, int device, Stream) {
  KBN_FAIL("cuda_alloc: kb-nano was built without CUDA; cannot allocate ", nbytes, " bytes on cuda:", device);
}
void raw_cuda_free(void*) { KBN_FAIL("cuda_free: kb-nano was built without CUDA"); }
void raw_retire_stream(Stream) {}
}  // namespace
AllocatorStats cuda_allocator_stats(int) { return {}; }
void cuda_empty_cache() {}
void cuda_empty_cache(int) {}
void cuda_graph_memory_released(int) {}

#endif

// ---- allocation audit ----

namespace {

struct AuditedBlock {
  void* base = nullptr;  // what the raw allocator returned; the user pointer is base + kAuditGuardBytes
  size_t nbytes = 0;
  Device device;
  Stream stream = nullptr;
};

struct AuditState {
  std::mutex mu;
  std::atomic<bool> active{false};
  std::atomic<size_t> tracked{0};                // live + retired, so the free path skips the map when 0
  std::unordered_map<void*, AuditedBlock> live;  // keyed by the user pointer
  std::vector<AuditedBlock> retired;             // freed while a CUDA graph was being captured
  std::vector<GuardViolation> violations;
};

AuditState& audit() {
  static auto* a = new AuditState();  // leaked on purpose, like the caching allocator
  return *a;
}

// Position-dependent canary, so neither a memset nor a shifted copy of the pattern passes for it.
unsigned char canary_byte(size_t i) { return static_cast<unsigned char>(0xA5 ^ (i * 29)); }

const std::vector<unsigned char>& canary() {
  static const std::vector<unsigned char> c = [] {
    std::vector<unsigned char> v(kAuditGuardBytes);
    for (size_t i = 0; i < v.size(); ++i) v[i] = canary_byte(i);
    return v;
  }();
  return c;
}

void write_guards_and_poison(const AuditedBlock& b) {
  unsigned char* base = static_cast<unsigned char*>(b.base);
  unsigned char* user = base + kAuditGuardBytes;
  if (b.device.is_cpu()) {
    std::memcpy(base, canary().data(), kAuditGuardBytes);
    std::memset(user, kAuditPoisonByte, b.nbytes);
    std::memcpy(user + b.nbytes, canary().data(), kAuditGuardBytes);
    return;
  }
#ifdef KBN_WITH_CUDA
  // Ordered on the block's stream, before any use of the block there.
  KBN_CUDA_CHECK(cudaMemcpyAsync(base, canary().data(), kAuditGuardBytes, cudaMemcpyHostToDevice, b.stream));
  KBN_CUDA_CHECK(cudaMemsetAsync(user, kAuditPoisonByte, b.nbytes, b.stream));
  KBN_CUDA_CHECK(cudaMemcpyAsync(user + b.nbytes, canary().data(), kAuditGuardBytes, cudaMemcpyHostToDevice, b.stream));
  KBN_CUDA_CHECK(cudaStreamSynchronize(b.stream));  // the host canary buffer is pageable: finish the copies
#endif
}

// Appends what is wrong with `b`'s guards to `out`. CUDA blocks: the caller synchronised.
void verify_guards(const AuditedBlock& b, std::vector<GuardViolation>& out) {
  std::vector<unsigned char> zone(kAuditGuardBytes);
  const unsigned char* base = static_cast<const unsigned char*>(b.base);
  for (int side = 0; side < 2; ++side) {
    const unsigned char* src = side == 0 ? base : base + kAuditGuardBytes + b.nbytes;
    if (b.device.is_cpu()) {
      std::memcpy(zone.data(), src, kAuditGuardBytes);
    } else {
#ifdef KBN_WITH_CUDA
      KBN_CUDA_CHECK(cudaMemcpy(zone.data(), src, kAuditGuardBytes, cudaMemcpyDeviceToHost));
#endif
    }
    for (size_t i = 0; i < kAuditGuardBytes; ++i) {
      if (zone[i] != canary_byte(i)) {
        out.push_back(GuardViolation{b.nbytes, b.device, side == 0, i});
        break;
      }
    }
  }
}

void release(const AuditedBlock& b) {
  if (b.device.is_cpu())
    raw_cpu_free(b.base);
  else
    raw_cuda_free(b.base);
}

bool capturing(Stream s) {
#ifdef KBN_WITH_CUDA
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();
    return true;  // cannot tell: do not touch the device
  }
  return st != cudaStreamCaptureStatusNone;
#else
  (void)s;
  return false;
#endif
}

void* audited_alloc(size_t nbytes, Device device, Stream stream) {
  AuditedBlock b;
  b.nbytes = nbytes;
  b.device = device;
  b.stream = stream;
  const size_t total = nbytes + 2 * kAuditGuardBytes;
  b.base = device.is_cpu() ? raw_cpu_alloc(total) : raw_cuda_alloc(total, device.index, stream);
  write_guards_and_poison(b);
  void* user = static_cast<unsigned char*>(b.base) + kAuditGuardBytes;
  AuditState& a = audit();
  std::lock_guard<std::mutex> lock(a.mu);
  a.live.emplace(user, b);
  a.tracked++;
  return user;
}

// True when `p` was an audited block (now verified and released, or retired until it can be verified).
bool audited_free(void* p) {
  AuditState& a = audit();
  if (a.tracked.load() == 0) return false;
  AuditedBlock b;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.live.find(p);
    if (it == a.live.end()) return false;
    b = it->second;
    a.live.erase(it);
    if (b.device.is_cuda() && capturing(b.stream)) {
      a.retired.push_back(b);
      return true;
    }
    a.tracked--;
  }
#ifdef KBN_WITH_CUDA
  // NOTE: a block can outlive its stream (a candidate caching a tensor across bench cases, each with its own
  // stream): then wait for the whole device. Frees run in destructors, so nothing here may throw.
  if (b.device.is_cuda() && cudaStreamSynchronize(b.stream) != cudaSuccess) {
    cudaGetLastError();
    cudaDeviceSynchronize();
  }
#endif
  std::vector<GuardViolation> found;
  try {
    verify_guards(b, found);
  } catch (const Error&) {
    found.push_back(GuardViolation{b.nbytes, b.device, false, 0});  // unreadable guards count as broken
  }
  release(b);
  if (!found.empty()) {
    std::lock_guard<std::mutex> lock(a.mu);
    a.violations.insert(a.violations.end(), found.begin(), found.end());
  }
  return true;
}

}  // namespace

std::string GuardViolation::describe() const {
  return std::string("a ") + std::to_string(nbytes) + "-byte buffer on " + device.str() + " was written " +
         (before ? "before its start (" + std::to_string(kAuditGuardBytes - offset) + " bytes before)"
                 : "past its end (at byte " + std::to_string(nbytes + offset) + ")");
}

AllocationAudit::AllocationAudit() {
  bool expected = false;
  KBN_CHECK(audit().active.compare_exchange_strong(expected, true),
            "AllocationAudit: an audit is already active (audits do not nest)");
}
AllocationAudit::~AllocationAudit() { audit().active = false; }

bool allocation_audit_active() { return audit().active.load(); }

std::vector<GuardViolation> take_guard_violations() {
  AuditState& a = audit();
  std::vector<AuditedBlock> live, retired;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    for (const auto& [p, b] : a.live) live.push_back(b);
    retired.swap(a.retired);
    a.tracked -= retired.size();
  }
#ifdef KBN_WITH_CUDA
  bool any_cuda = false;
  for (const auto* v : {&live, &retired})
    for (const auto& b : *v) any_cuda |= b.device.is_cuda();
  if (any_cuda) KBN_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  std::vector<GuardViolation> found;
  for (const auto& b : live) verify_guards(b, found);
  for (const auto& b : retired) {
    verify_guards(b, found);
    release(b);
  }
  std::lock_guard<std::mutex> lock(a.mu);
  found.insert(found.begin(), a.violations.begin(), a.violations.end());
  a.violations.clear();
  return found;
}

void cuda_stream_retiring(Stream stream) {
  if (stream == nullptr) return;
  {
    AuditState& a = audit();
    std::lock_guard<std::mutex> lock(a.mu);
    for (auto& [p, b] : a.live)
      if (b.stream == stream) b.stream = nullptr;
    for (auto& b : a.retired)
      if (b.stream == stream) b.stream = nullptr;
  }
  raw_retire_stream(stream);
}

size_t audited_block_count() {
  std::lock_guard<std::mutex> lock(audit().mu);
  return audit().live.size();
}

void* cpu_alloc(size_t nbytes) {
  if (audit().active.load()) return audited_alloc(nbytes, Device::cpu(), nullptr);
  return raw_cpu_alloc(nbytes);
}

void cpu_free(void* p) {
  if (!audited_free(p)) raw_cpu_free(p);
}

void* cuda_alloc(size_t nbytes, int device, Stream stream) {
  if (audit().active.load()) return audited_alloc(nbytes, Device::cuda(device), stream);
  return raw_cuda_alloc(nbytes, device, stream);
}

void cuda_free(void* p) {
  if (!audited_free(p)) raw_cuda_free(p);
}

}  // namespace kbn
