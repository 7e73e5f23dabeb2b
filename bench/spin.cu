#include "bench/spin.h"

#ifdef KBN_WITH_CUDA
#include <cstdint>

#include "kbn/cuda_check.h"

namespace kbn::bench {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(256);
}

}  // namespace

void spin_on_device(double ms, cudaStream_t stream) {
  const uint64_t ns = ms > 0 ? uint64_t(ms * 1e6) : 0;
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace kbn::bench
#endif  // KBN_WITH_CUDA
