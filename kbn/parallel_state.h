#pragma once
// Tensor-parallel state of the calling thread (one thread per rank: engine::TensorParallelGroup). Parallel
// linears read it to size their shards; the all-reduce op and the LM head's logits gather use the communicator.
#include <cstdint>

namespace kbn {

class Communicator;  // kbn/comm.h

struct ParallelState {
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;  // this rank's communicator when tp_size > 1 (not owned)
};

const ParallelState& parallel_state();
void set_parallel_state(const ParallelState& s);

// ceil-free division that refuses uneven splits, naming what was split.
int64_t divide_exact(int64_t numerator, int64_t denominator, const char* what);

}  // namespace kbn
