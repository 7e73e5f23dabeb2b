#pragma once
#include <string>

// Opaque CUDA stream handle, so CPU-only code and headers need no CUDA include.
struct CUstream_st;

namespace kbn {

using Stream = CUstream_st*;

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && (type == DeviceType::CPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// "cpu", "cuda", "cuda:1"; the error names what was expected.
Device parse_device(const std::string& s);

// True when this binary was built with CUDA and a GPU is visible.
bool cuda_available();
int cuda_device_count();

// Programmatic dependent launch (Hopper and later; kbn/pdl.cuh): the kernels written for it, which wait for the grids
// before them before touching memory, are launched so that they may be scheduled while the kernel before them on the
// stream drains, hiding the launch gap between small kernels and letting a GEMV's first weight loads overlap the kernel
// before it. On by default where the GPU has it (compute capability 9.0 and later: measured +2.4-3.1% at batch-1
// decode and neutral at batch 32, bench/results/h100/session28/); KBN_PDL=0 (or eval --no-pdl) turns it off, KBN_PDL=1
// forces it on; set_dependent_launch overrides both. Kernels launched while it is on keep it inside the CUDA graphs
// they are captured into.
bool dependent_launch_enabled();
void set_dependent_launch(bool on);

// The stream that ops launch on for the calling thread (default: the legacy default stream, nullptr).
Stream current_stream();
void set_current_stream(Stream s);

// RAII: makes `device` the calling thread's current CUDA device and restores the previous one (no-op for the
// CPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;  // -1: nothing to restore
};

// A stream created for one job (cudaStreamNonBlocking: no implicit synchronisation with the legacy default
// stream, so work another stream does is never waited for by accident); destroyed after a sync.
class OwnedStream {
 public:
  // high_priority: the device's greatest stream priority (its blocks are scheduled first when several streams have
  // work waiting for SMs), else the default.
  explicit OwnedStream(Device device, bool high_priority = false);
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

class StreamGuard {
 public:
  explicit StreamGuard(Stream s) : prev_(current_stream()) { set_current_stream(s); }
  ~StreamGuard() { set_current_stream(prev_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

}  // namespace kbn
