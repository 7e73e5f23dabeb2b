#include "kbn/device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kbn/allocator.h"
#include "kbn/error.h"
#include "kbn/tensor.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

namespace kbn {

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string idx = s.substr(5);
    KBN_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos,
              "device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
    return Device::cuda(std::stoi(idx));
  }
  KBN_FAIL("device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
}

namespace {
std::atomic<int> g_dependent_launch{-1};  // -1: not decided yet (KBN_PDL, else the GPU's compute capability)

// On where the current GPU has programmatic dependent launch (compute capability 9.0 and later).
int default_dependent_launch() {
#ifdef KBN_WITH_CUDA
  if (cuda_device_count() == 0) return 0;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major >= 9 ? 1 : 0;
#else
  return 0;
#endif
}
}  // namespace

bool dependent_launch_enabled() {
  int v = g_dependent_launch.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("KBN_PDL");
    const std::string e = env ? env : "";
    KBN_CHECK(e.empty() || e == "0" || e == "1", "KBN_PDL: expected 0 (dependent launch off) or 1 (on), got '", e,
              "'");
    v = e == "0" ? 0 : e == "1" ? 1 : default_dependent_launch();
    int expected = -1;
    if (!g_dependent_launch.compare_exchange_strong(expected, v)) v = expected;
  }
  return v == 1;
}

void set_dependent_launch(bool on) { g_dependent_launch.store(on ? 1 : 0); }

static thread_local Stream tls_stream = nullptr;
Stream current_stream() { return tls_stream; }
void set_current_stream(Stream s) { tls_stream = s; }

#ifdef KBN_WITH_CUDA

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memmove(dst, src, nbytes);
    return;
  }
  // Host-side copies are synchronous with respect to the host (pageable memory): the data is valid
  // after return. Device-to-device copies are ordered on the current stream.
  Stream s = current_stream();
  if (dst_dev.is_cuda() && src_dev.is_cuda()) {
    KBN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  cudaMemcpyKind kind = dst_dev.is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  KBN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s));
  KBN_CUDA_CHECK(cudaStreamSynchronize(s));
}

DeviceGuard::DeviceGuard(Device device) {
  if (device.is_cpu()) return;
  int prev = 0;
  KBN_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev == device.index) return;
  KBN_CUDA_CHECK(cudaSetDevice(device.index));
  prev_ = prev;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

OwnedStream::OwnedStream(Device device, bool high_priority) {
  if (device.is_cpu()) return;
  const DeviceGuard guard(device);
  int least = 0, greatest = 0;
  if (high_priority) KBN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  KBN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, high_priority ? greatest : least));
}

OwnedStream::~OwnedStream() {
  if (!stream_) return;
  cudaStreamSynchronize(stream_);
  cuda_stream_retiring(stream_);
  cudaStreamDestroy(stream_);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  KBN_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

#else

int cuda_device_count() { return 0; }
bool cuda_available() { return false; }

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  KBN_CHECK(dst_dev.is_cpu() && src_dev.is_cpu(), "copy_bytes: kb-nano was built without CUDA; cannot copy ",
            src_dev.str(), " -> ", dst_dev.str());
  if (nbytes) std::memmove(dst, src, nbytes);
}

DeviceGuard::DeviceGuard(Device device) {
  KBN_CHECK(device.is_cpu(), "DeviceGuard: kb-nano was built without CUDA; no device ", device.str());
}
DeviceGuard::~DeviceGuard() = default;

OwnedStream::OwnedStream(Device device, bool) {
  KBN_CHECK(device.is_cpu(), "OwnedStream: kb-nano was built without CUDA; no device ", device.str());
}
OwnedStream::~OwnedStream() = default;

void synchronize(Device device) {
  KBN_CHECK(device.is_cpu(), "synchronize: kb-nano was built without CUDA; no device ", device.str());
}

namespace cuda {
void convert(const void*, DType, void*, DType, int64_t, int device) {
  KBN_FAIL("convert: kb-nano was built without CUDA; no device cuda:", device);
}
void strided_copy(const Tensor& dst, const Tensor&) {
  KBN_FAIL("strided_copy: kb-nano was built without CUDA; no device ", dst.device().str());
}
void fill(void*, DType, int64_t, double, int device) {
  KBN_FAIL("fill: kb-nano was built without CUDA; no device cuda:", device);
}
}  // namespace cuda

#endif

}  // namespace kbn
