#pragma once
// RAII holders of the bench's CUDA resources, released on every path (including errors). CUDA builds only.
#include <cstddef>

#include "kbn/cuda_check.h"

namespace kbn::bench {

struct EventPair {
  cudaEvent_t start = nullptr, end = nullptr;
  EventPair() {
    KBN_CUDA_CHECK(cudaEventCreate(&start));
    KBN_CUDA_CHECK(cudaEventCreate(&end));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(end);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// A device allocation for one measurement.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { KBN_CUDA_CHECK(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace kbn::bench
