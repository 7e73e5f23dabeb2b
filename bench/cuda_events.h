#pragma once
// A start/end pair of CUDA events, released on every path (including errors). CUDA builds only.
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

}  // namespace kbn::bench
