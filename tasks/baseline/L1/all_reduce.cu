#include "L1/all_reduce.h"

#include "kbn/checks.h"
#include "kbn/parallel_state.h"
#if defined(KBN_WITH_CUDA) && defined(KBN_WITH_NCCL)
#include <nccl.h>

#include <type_traits>

#include "kbn/cuda_dispatch.cuh"
#endif

namespace kbn::KBN_VARIANT {

#if defined(KBN_WITH_CUDA) && defined(KBN_WITH_NCCL)
namespace {

// ---- kernel layer: one NCCL collective on the caller's stream ----

template <class T>
constexpr ncclDataType_t nccl_type_of() {
  if constexpr (std::is_same_v<T, __half>)
    return ncclFloat16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return ncclBfloat16;
  else
    return ncclFloat32;
}

// In place: data[0, count) <- sum over the ranks of comm. NCCL orders the collective on `stream` like a
// kernel, so it is captured by CUDA graphs and needs no synchronisation here.
void launch_all_reduce(void* data, size_t count, ncclDataType_t type, ncclComm_t comm, Stream stream,
                       const ParallelState& ps, const Tensor& x) {
  const ncclResult_t r = ncclAllReduce(data, data, count, type, ncclSum, comm, stream);
  KBN_CHECK(r == ncclSuccess, "all_reduce: ncclAllReduce failed with ", ncclGetErrorString(r), " on ", x.str(),
            " (rank ", ps.tp_rank, " of ", ps.tp_size, ")");
}

}  // namespace
#endif

// ---- op layer ----

Tensor AllReduce::forward(const Tensor& x) {
  constexpr const char* op = "all_reduce";
  check_defined(x, op, "x");
  const ParallelState& ps = parallel_state();
  if (ps.tp_size == 1) return x;
  KBN_CHECK(x.is_cuda(), op, ": tensor-parallel size ", ps.tp_size, " needs CUDA tensors (NCCL), got 'x' ", x.str());
  check_contiguous(x, op, "x");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
#if defined(KBN_WITH_CUDA) && defined(KBN_WITH_NCCL)
  KBN_CHECK(ps.nccl_comm != nullptr, op, ": tensor-parallel size ", ps.tp_size,
            " but parallel_state().nccl_comm is null (rank ", ps.tp_rank, ")");
  ncclDataType_t type = ncclFloat32;
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) { type = nccl_type_of<decltype(t)>(); });
  launch_all_reduce(x.data_ptr(), size_t(x.numel()), type, static_cast<ncclComm_t>(ps.nccl_comm), current_stream(), ps,
                    x);
#else
  KBN_FAIL(op, ": tensor-parallel size ", ps.tp_size, " needs a build with NCCL");
#endif
  return x;
}

}  // namespace kbn::KBN_VARIANT
