#include "kbn/peer_all_reduce.h"

#include <algorithm>
#include <cstdint>

#include "kbn/checks.h"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device.h"

namespace kbn {

namespace {

constexpr int kMaxRanks = 8;
// Every call launches all kBlocks blocks, whatever its size, so that every block's counter is the call count and
// one epoch (and one staging half) holds for the whole call on every rank: a block's slice depends on the grid, so
// blocks of different calls must not disagree on which half is safe to write.
constexpr int kBlocks = 32;
constexpr int kThreads = 512;
constexpr unsigned long long kTimeoutNs = 10ull * 1000 * 1000 * 1000;

// Rank r's signal area, in rank r's memory. flag[b][p]: the last epoch in which rank p's block b finished writing
// its staging slice (written by rank p). counter[b]: this rank's block b's epoch (read and written by it alone).
struct Signal {
  uint32_t flag[kBlocks][kMaxRanks];
  uint32_t counter[kBlocks];
};

struct Args {
  char* staging[kMaxRanks];  // rank p's staging buffer: two halves of half_bytes
  Signal* signal[kMaxRanks];
  int64_t half_bytes;
  int rank, size;
};

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// x: nvec 16-byte vectors of T. Grid-stride slices: block b owns vectors b*kThreads + t + k*kBlocks*kThreads on
// every rank, so a block only waits for the blocks of the same index. Why two halves suffice: rank p rewrites
// half h in call e + 2 only after its call e + 1 kernel completed, which needed flags e + 1 from every block of
// every peer, raised only after that peer's call e kernel (all its reads of half h) completed.
template <class T>
__global__ void __launch_bounds__(kThreads) one_shot_all_reduce_kernel(Args a, T* x, int64_t nvec) {
  using V = Vec16<T>;
  Signal* me = a.signal[a.rank];
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = ++me->counter[blockIdx.x];
  __syncthreads();
  const uint32_t epoch = epoch_s;
  const int64_t half = int64_t(epoch & 1u) * a.half_bytes;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  V* xv = reinterpret_cast<V*>(x);
  V* mine = reinterpret_cast<V*>(a.staging[a.rank] + half);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nvec; i += stride) mine[i] = xv[i];
  __syncthreads();  // the block's staging writes happen before its flags (the release below is cumulative)
  if (threadIdx.x < a.size) {
    const int p = threadIdx.x;
    store_release_sys(&a.signal[p]->flag[blockIdx.x][a.rank], epoch);
    const uint32_t* theirs = &me->flag[blockIdx.x][p];
    const unsigned long long start = global_ns();
    while (int32_t(load_acquire_sys(theirs) - epoch) < 0) {
      if (global_ns() - start > kTimeoutNs) {
        printf("kb-nano peer all-reduce: rank %d block %d waited 10 s for rank %d at epoch %u; trapping\n", a.rank,
               int(blockIdx.x), p, epoch);
        asm volatile("trap;");
      }
    }
  }
  __syncthreads();
  constexpr int N = V::N;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nvec; i += stride) {
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = 0.f;
    for (int p = 0; p < a.size; ++p) {
      const V v = reinterpret_cast<const V*>(a.staging[p] + half)[i];
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += to_f32(v.v[j]);
    }
    V out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = from_f32<T>(acc[j]);
    xv[i] = out;
  }
}

}  // namespace

class PeerAllReduceGroup {
 public:
  PeerAllReduceGroup(std::vector<int> devices, size_t max_bytes) : devices_(std::move(devices)), max_bytes_(max_bytes) {
    KBN_CHECK(devices_.size() >= 2 && devices_.size() <= size_t(kMaxRanks), "peer all-reduce: 2 to ", kMaxRanks,
              " ranks, got ", devices_.size());
    KBN_CHECK(max_bytes_ > 0 && max_bytes_ % 16 == 0, "peer all-reduce: max_bytes must be a positive multiple of 16, got ",
              max_bytes_);
    try {
      for (size_t r = 0; r < devices_.size(); ++r) {
        const DeviceGuard guard(Device::cuda(devices_[r]));
        staging_.push_back(nullptr);
        signal_.push_back(nullptr);
        void* staging = nullptr;
        KBN_CUDA_CHECK(cudaMalloc(&staging, 2 * max_bytes_));
        staging_.back() = static_cast<char*>(staging);
        KBN_CUDA_CHECK(cudaMalloc(&signal_.back(), sizeof(Signal)));
        KBN_CUDA_CHECK(cudaMemset(signal_.back(), 0, sizeof(Signal)));
      }
      for (size_t r = 0; r < devices_.size(); ++r) synchronize(Device::cuda(devices_[r]));
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~PeerAllReduceGroup() { release(); }
  int device(int rank) const { return devices_[size_t(rank)]; }
  size_t max_bytes() const { return max_bytes_; }
  Args args(int rank) const {
    Args a{};
    for (size_t p = 0; p < devices_.size(); ++p) {
      a.staging[p] = staging_[p];
      a.signal[p] = static_cast<Signal*>(signal_[p]);
    }
    a.half_bytes = int64_t(max_bytes_);
    a.rank = rank;
    a.size = int(devices_.size());
    return a;
  }

 private:
  void release() {
    for (size_t r = 0; r < staging_.size(); ++r) {
      const DeviceGuard guard(Device::cuda(devices_[r]));
      if (staging_[r]) cudaFree(staging_[r]);
      if (signal_[r]) cudaFree(signal_[r]);
    }
    staging_.clear();
    signal_.clear();
  }

  std::vector<int> devices_;
  size_t max_bytes_;
  std::vector<char*> staging_;
  std::vector<void*> signal_;
};

PeerAllReduce::PeerAllReduce(std::shared_ptr<PeerAllReduceGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}
PeerAllReduce::~PeerAllReduce() = default;

size_t PeerAllReduce::max_bytes() const { return group_->max_bytes(); }

bool PeerAllReduce::accepts(const Tensor& x) const {
  if (!x.defined() || !x.is_cuda() || x.device().index != group_->device(rank_) || !x.is_contiguous()) return false;
  if (x.dtype() != DType::f32 && x.dtype() != DType::f16 && x.dtype() != DType::bf16) return false;
  return x.nbytes() <= group_->max_bytes() && x.nbytes() % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

void PeerAllReduce::all_reduce_sum(const Tensor& x, Stream stream) {
  KBN_CHECK(accepts(x), "peer all-reduce (rank ", rank_, "): needs a contiguous f32/f16/bf16 tensor on cuda:",
            group_->device(rank_), " of at most ", group_->max_bytes(),
            " bytes, a multiple of 16 bytes, 16-byte aligned; got ", x.str());
  const int64_t nvec = int64_t(x.nbytes() / 16);
  if (nvec == 0) return;
  const Args a = group_->args(rank_);
  dispatch_float16_32(x.dtype(), "all_reduce (peer)", "x", [&](auto t) {
    using T = decltype(t);
    one_shot_all_reduce_kernel<T><<<kBlocks, kThreads, 0, stream>>>(a, static_cast<T*>(x.data_ptr()), nvec);
  });
  KBN_CUDA_CHECK_LAUNCH();
}

std::vector<std::unique_ptr<PeerAllReduce>> make_peer_all_reduce(const std::vector<int>& devices, size_t max_bytes) {
  std::vector<std::unique_ptr<PeerAllReduce>> out;
  if (devices.size() < 2 || devices.size() > size_t(kMaxRanks)) return out;
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      KBN_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) return out;
    }
  for (int a : devices) {
    const DeviceGuard guard(Device::cuda(a));
    for (int b : devices) {
      if (a == b) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // clear it: enabled before is what we need
      } else {
        KBN_CUDA_CHECK(e);
      }
    }
  }
  auto group = std::make_shared<PeerAllReduceGroup>(devices, max_bytes);
  for (size_t r = 0; r < devices.size(); ++r) out.push_back(std::make_unique<PeerAllReduce>(group, int(r)));
  return out;
}

}  // namespace kbn
