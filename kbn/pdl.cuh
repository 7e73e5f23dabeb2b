#pragma once
// Programmatic dependent launch (PDL; Hopper and later), for kb-nano's own kernels. A kernel written for it calls
// pdl_wait() before it touches any memory (reads what earlier kernels wrote, or writes what they read): launched by
// launch_pdl while kbn::dependent_launch_enabled(), it may be scheduled as soon as every block of the kernel before it
// on the stream has passed that kernel's pdl_wait, and waits in its own until that grid has completed and its writes
// are visible: the launch between the two kernels, and whatever read-only work comes before the wait, overlap the
// kernel before. Without the attribute (PDL off, or a plain launch) pdl_wait returns at once. Only kernels that call
// pdl_wait first may go through launch_pdl: one that did not could race the kernel before it. Kernels after a
// PDL-launched one need nothing: a plain launch waits for it as always, and a PDL-launched one waits in its own
// pdl_wait (which waits for the grid before it, which itself waited for its own: the chain is ordered). Included only
// by CUDA translation units.
#include <cuda_runtime.h>

#include <utility>

#include "kbn/cuda_check.h"
#include "kbn/device.h"

namespace kbn {

// Waits until the grids this one depends on have completed and their memory operations are visible (griddepcontrol.
// wait), then lets the grid launched after this one be scheduled (griddepcontrol.launch_dependents: once every block
// of this grid has passed here or exited), so that its work before its own pdl_wait (a GEMV's first weight loads)
// overlaps this grid's run, not only the launch between the two. Releasing after the wait, not before, keeps at most
// two grids in flight and makes everything before this grid complete for the successor. The successor still waits in
// its pdl_wait for this grid's completion, so the release is only a scheduling hint. A no-op below sm_90 and for a
// grid launched without programmatic dependency.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when dependent launch is on;
// checks the launch. `kernel` must call pdl_wait() before touching memory.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Stream stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  KBN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace kbn
