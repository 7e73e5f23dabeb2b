#include "bench/ceilings.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "kbn/device.h"
#include "kbn/error.h"
#include "kbn/registry.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"
#ifdef KBN_WITH_CUDA
#include "bench/cuda_events.h"
#include "kbn/cuda_check.h"
#endif

namespace kbn::bench {

#ifdef KBN_WITH_CUDA
namespace {

constexpr int kRepeats = 10;
constexpr int kWarmup = 2;

// Median milliseconds of `enqueue` over kRepeats event-bracketed runs on the current stream.
template <class Enqueue>
double median_ms(Enqueue enqueue) {
  const cudaStream_t stream = current_stream();
  for (int i = 0; i < kWarmup; ++i) enqueue();
  KBN_CUDA_CHECK(cudaDeviceSynchronize());
  EventPair ev;
  std::vector<double> ms;
  for (int i = 0; i < kRepeats; ++i) {
    KBN_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    enqueue();
    KBN_CUDA_CHECK(cudaEventRecord(ev.end, stream));
    KBN_CUDA_CHECK(cudaDeviceSynchronize());
    float t = 0;
    KBN_CUDA_CHECK(cudaEventElapsedTime(&t, ev.start, ev.end));
    ms.push_back(double(t));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double copy_bandwidth_gb_per_s() {
  constexpr size_t kBytes = size_t(2) << 30;
  void* src = nullptr;
  void* dst = nullptr;
  KBN_CUDA_CHECK(cudaMalloc(&src, kBytes));
  cudaError_t dst_status = cudaMalloc(&dst, kBytes);
  if (dst_status != cudaSuccess) {
    cudaFree(src);
    KBN_CUDA_CHECK(dst_status);
  }
  double ms = 0;
  try {
    KBN_CUDA_CHECK(cudaMemset(src, 1, kBytes));
    ms = median_ms(
        [&] { KBN_CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, current_stream())); });
  } catch (...) {
    cudaFree(src);
    cudaFree(dst);
    throw;
  }
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * double(kBytes) / (ms * 1e-3) / 1e9;  // read + written
}

double bf16_matmul_tflop_per_s(int device_index) {
  constexpr int64_t kSize = 8192;
  const Device device = Device::cuda(device_index);
  OpArgs args;
  args.op = "linear";
  args.opts = ParamOptions{DType::bf16, device};
  std::unique_ptr<AnyOp> linear = registry(Variant::baseline).get("linear").make(args);
  Tensor x = Tensor::empty({kSize, kSize}, DType::bf16, device);
  Tensor w = Tensor::empty({kSize, kSize}, DType::bf16, device);
  fill_normal_(x, hash_seed(1, "ceiling.x"), 0.0, 1.0);
  fill_normal_(w, hash_seed(1, "ceiling.w"), 0.0, 0.02);
  const std::vector<Tensor> inputs{x, w, Tensor()};
  const double ms = median_ms([&] { linear->call(inputs); });
  return 2.0 * double(kSize) * double(kSize) * double(kSize) / (ms * 1e-3) / 1e12;
}

}  // namespace

DeviceInfo query_device(int index) {
  KBN_CHECK(cuda_available(), "kb_nano kernels times CUDA kernels; no GPU visible");
  DeviceInfo d;
  d.index = index;
  cudaDeviceProp prop{};
  KBN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = prop.l2CacheSize;
  d.memory_bytes = (long long)prop.totalGlobalMem;
  KBN_CUDA_CHECK(cudaDeviceGetAttribute(&d.clock_khz, cudaDevAttrClockRate, index));
  KBN_CUDA_CHECK(cudaDeviceGetAttribute(&d.memory_clock_khz, cudaDevAttrMemoryClockRate, index));
  KBN_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  KBN_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

Ceilings measure_ceilings() {
  KBN_CHECK(cuda_available(), "kb_nano kernels times CUDA kernels; no GPU visible");
  int device_index = 0;
  KBN_CUDA_CHECK(cudaGetDevice(&device_index));
  Ceilings c;
  c.copy_gb_per_s = copy_bandwidth_gb_per_s();
  c.bf16_tflop_per_s = bf16_matmul_tflop_per_s(device_index);
  return c;
}

#else

DeviceInfo query_device(int) { KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA"); }
Ceilings measure_ceilings() { KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA"); }

#endif

}  // namespace kbn::bench
