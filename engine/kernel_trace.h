#pragma once
// Where a serving run's GPU time goes, kernel by kernel: every kernel the process runs between start and stop is
// recorded by CUPTI's activity tracing (the mechanism Nsight Systems uses; kernels replayed from CUDA graphs
// included), then summed per kernel and per kb-nano op (kernel_op(): rms_norm, linear, flash_attn_decode, ...).
// This answers the question a kernel engineer brings to a serving benchmark: which op would moving the end-to-end
// number take. The aggregation (KernelTraceBuilder) is plain C++; only KernelTracer needs a GPU and libcupti,
// which is opened at run time ($KBN_CUPTI_LIBRARY, else libcupti.so.13 on the loader's path, the CUDA toolkit's
// lib64, extras/CUPTI/lib64 and targets/ folders, or pip's nvidia-cuda-cupti), so a binary that never traces
// never needs it.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kbn::engine {

// The kb-nano op a kernel belongs to, from its (demangled) name and the kernel names each op declares in its
// facts file (OpEntry::kernels: rms_norm covers fused_add_rms_norm; linear covers cuBLAS/cuBLASLt GEMMs and
// kb-nano's GEMV; all_reduce the peer kernel and NCCL); "a / b (shared kernel)" for a kernel several ops declare
// (the fallback both attention ops launch), "tensor copies and fills" for the tensor library's own kernels, else
// "other".
std::string kernel_op(const std::string& kernel_name);

struct KernelStat {
  std::string name;  // the kernel (demangled, parameters cut) or the op
  std::string op;
  int64_t calls = 0;
  double total_s = 0;
  // The busy time during which one of its kernels was the oldest kernel running on its device: a kernel launched
  // before the one ahead of it has ended (programmatic dependent launch) waits for it, so the overlap is charged to
  // the older one. Summed over every kernel, the busy time; each op's share of it is what removing the op's kernels
  // from the stream would save, while total_s double-counts the overlaps.
  double attributed_s = 0;
};

struct KernelTrace {
  double wall_s = 0;                // host time between start and stop
  std::map<int, double> busy_s;     // per device: time with at least one kernel running (union of intervals)
  int64_t kernels = 0;
  double kernel_s = 0;              // sum of all kernel durations
  std::vector<KernelStat> by_op;    // descending total_s
  std::vector<KernelStat> by_kernel;  // descending total_s
};

// Collects kernel records; finish() sums them.
class KernelTraceBuilder {
 public:
  // `name`: the kernel's name as recorded (mangled or not); `start_ns` <= `end_ns` on the device's clock.
  void add(const std::string& name, int device, uint64_t start_ns, uint64_t end_ns);
  KernelTrace finish(double wall_s) const;

 private:
  struct Agg {
    int64_t calls = 0;
    uint64_t total_ns = 0;
  };
  struct Interval {
    uint64_t start, end;
    const std::string* name;  // a key of by_name_ (std::map keys stay in place)
  };
  std::map<std::string, Agg> by_name_;
  std::map<int, std::vector<Interval>> intervals_;
};

// Demangles a C++ symbol and cuts its parameter list ("void f<float>(P)" -> "f<float>"); other names unchanged.
std::string short_kernel_name(const std::string& name);

// Records every kernel launched on any GPU of the process from construction until stop(). One at a time per
// process (CUPTI's activity buffers are process-wide): a second tracer while one runs is refused. Throws, naming
// every place it looked, when libcupti cannot be opened, and with CUPTI's message when tracing cannot start.
// CUDA builds only (a CPU build's constructor says so).
class KernelTracer {
 public:
  KernelTracer();
  ~KernelTracer();
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;
  // Waits for the device, flushes CUPTI's buffers, stops tracing and returns the summary.
  KernelTrace stop();

 private:
  double start_s_ = 0;
  bool running_ = false;
};

}  // namespace kbn::engine
