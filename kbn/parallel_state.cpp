#include "kbn/parallel_state.h"

#include "kbn/error.h"

namespace kbn {

namespace {
thread_local ParallelState tls_state;
}

const ParallelState& parallel_state() { return tls_state; }

void set_parallel_state(const ParallelState& s) {
  KBN_CHECK(s.tp_size >= 1 && s.tp_rank >= 0 && s.tp_rank < s.tp_size,
            "set_parallel_state: need 0 <= tp_rank < tp_size, got rank ", s.tp_rank, " of ", s.tp_size);
  tls_state = s;
}

int64_t divide_exact(int64_t numerator, int64_t denominator, const char* what) {
  KBN_CHECK(denominator > 0 && numerator % denominator == 0, what, ": ", numerator,
            " is not divisible by the tensor-parallel size ", denominator);
  return numerator / denominator;
}

}  // namespace kbn
