#include "bench/l2_flush.h"

#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"

namespace kbn::bench {
namespace {

__global__ void read_flush_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // rarely true, but the compiler must load everything to know
}

}  // namespace

void flush_l2_by_reading(const void* buf, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  int device = 0, sms = 0;
  KBN_CUDA_CHECK(cudaGetDevice(&device));
  KBN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  read_flush_kernel<<<unsigned(sms * 4), 512, 0, stream>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace kbn::bench
#endif  // KBN_WITH_CUDA
