#pragma once
// Tensor-parallel state of the calling thread (one thread or process per GPU). Parallel linears read it to
// size their shards; the all-reduce op reads the communicator.
#include <cstdint>

namespace kbn {

struct ParallelState {
  int tp_rank = 0;
  int tp_size = 1;
  void* nccl_comm = nullptr;  // ncclComm_t when tp_size > 1
};

const ParallelState& parallel_state();
void set_parallel_state(const ParallelState& s);

// ceil-free division that refuses uneven splits, naming what was split.
int64_t divide_exact(int64_t numerator, int64_t denominator, const char* what);

}  // namespace kbn
