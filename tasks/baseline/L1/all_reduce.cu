#include "L1/all_reduce.h"

#include "kbn/checks.h"
#include "kbn/comm.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

// ---- op layer ----
// NOTE: the "kernel" is the communicator's collective: NCCL's ring/tree all-reduce on CUDA tensors (enqueued on
// the current stream, so CUDA graphs capture it), a rank-ordered shared-memory sum on CPU tensors
// (kbn/comm.h). A candidate all-reduce (a custom one-shot kernel over peer memory, as vLLM's
// custom_all_reduce) replaces this file.

Tensor AllReduce::forward(const Tensor& x) {
  constexpr const char* op = "all_reduce";
  check_defined(x, op, "x");
  const ParallelState& ps = parallel_state();
  if (ps.tp_size == 1) return x;
  check_contiguous(x, op, "x");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  KBN_CHECK(ps.comm != nullptr, op, ": tensor-parallel size ", ps.tp_size, " but rank ", ps.tp_rank,
            " has no communicator (run the model inside engine::TensorParallelGroup)");
  KBN_CHECK(ps.comm->size() == ps.tp_size && ps.comm->rank() == ps.tp_rank, op, ": the communicator is rank ",
            ps.comm->rank(), " of ", ps.comm->size(), " but parallel_state() says rank ", ps.tp_rank, " of ",
            ps.tp_size);
  ps.comm->all_reduce_sum(x);
  return x;
}

}  // namespace kbn::KBN_VARIANT
