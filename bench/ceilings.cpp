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
#include <cublasLt.h>

#include "bench/cuda_events.h"
#include "bench/l2_flush.h"
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

double read_bandwidth_gb_per_s() {
  constexpr size_t kBytes = size_t(2) << 30;
  DeviceBuffer buf(kBytes);
  KBN_CUDA_CHECK(cudaMemset(buf.ptr, 1, kBytes));
  uint32_t* sink = reinterpret_cast<uint32_t*>(static_cast<char*>(buf.ptr) + kBytes - 16);
  const double ms = median_ms([&] { flush_l2_by_reading(buf.ptr, kBytes - 16, sink, current_stream()); });
  return double(kBytes - 16) / (ms * 1e-3) / 1e9;
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
  c.read_gb_per_s = read_bandwidth_gb_per_s();
  c.bf16_tflop_per_s = bf16_matmul_tflop_per_s(device_index);
  return c;
}

namespace {

void lt_check(cublasStatus_t status, const char* call) {
  KBN_CHECK(status == CUBLAS_STATUS_SUCCESS, "bench: ", call, " failed while measuring a GEMM ceiling: ",
            cublasLtGetStatusString(status));
}

// The cuBLASLt objects of one measurement, destroyed on every path.
struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtGemm() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
  }
};

}  // namespace

GemmCeiling measure_gemm_ceiling(int64_t m, int64_t n, int64_t k, DType dtype, bool cold) {
  KBN_CHECK(m > 0 && n > 0 && k > 0, "bench: a GEMM ceiling needs positive sizes, got ", m, "x", n, "x", k);
  KBN_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32,
            "bench: GEMM ceilings are measured for bf16, f16 and f32, got ", dtype_name(dtype));
  const cudaDataType_t type = dtype == DType::bf16 ? CUDA_R_16BF : dtype == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
  const size_t es = dtype_size(dtype);
  constexpr size_t kWorkspace = size_t(32) << 20;
  constexpr size_t kFlush = size_t(256) << 20;
  DeviceBuffer x(size_t(m * k) * es), w(size_t(n * k) * es), out(size_t(m * n) * es), ws(kWorkspace);
  std::unique_ptr<DeviceBuffer> flush;
  if (cold) flush = std::make_unique<DeviceBuffer>(kFlush);
  // Values do not change a GEMM's time; zeros are enough (and cheap to write).
  KBN_CUDA_CHECK(cudaMemset(x.ptr, 0, size_t(m * k) * es));
  KBN_CUDA_CHECK(cudaMemset(w.ptr, 0, size_t(n * k) * es));
  if (cold) KBN_CUDA_CHECK(cudaMemset(flush->ptr, 0, kFlush));
  // out[m, n] row-major is C = W^T-applied: column-major C (n x m) = op(A) (n x k) * B (k x m), A = w as k x n
  // column-major (transposed), B = x as k x m column-major: the layout of the linear op.
  LtGemm g;
  lt_check(cublasLtCreate(&g.handle), "cublasLtCreate");
  lt_check(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
  lt_check(cublasLtMatrixLayoutCreate(&g.a, type, uint64_t(k), uint64_t(n), k), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&g.b, type, uint64_t(k), uint64_t(m), k), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&g.c, type, uint64_t(n), uint64_t(m), n), "layout C");
  lt_check(cublasLtMatmulPreferenceCreate(&g.pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t wsb = kWorkspace;
  lt_check(cublasLtMatmulPreferenceSetAttribute(g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
           "workspace preference");
  constexpr int kAlgos = 16;
  cublasLtMatmulHeuristicResult_t results[kAlgos] = {};
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(g.handle, g.desc, g.a, g.b, g.c, g.c, g.pref, kAlgos, results, &found),
           "cublasLtMatmulAlgoGetHeuristic");
  const cudaStream_t stream = current_stream();
  const float alpha = 1.0f, beta = 0.0f;
  uint32_t* sink = cold ? reinterpret_cast<uint32_t*>(static_cast<char*>(flush->ptr) + kFlush - 16) : nullptr;
  EventPair ev;
  GemmCeiling best;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = [&] {
      return cublasLtMatmul(g.handle, g.desc, &alpha, w.ptr, g.a, x.ptr, g.b, &beta, out.ptr, g.c, out.ptr, g.c,
                            &results[i].algo, ws.ptr, kWorkspace, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // an algorithm that refuses this shape is not a ceiling
    run();
    KBN_CUDA_CHECK(cudaDeviceSynchronize());
    double fastest = 0;
    for (int r = 0; r < 10; ++r) {
      if (cold) flush_l2_by_reading(flush->ptr, kFlush - 16, sink, stream);
      KBN_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      run();
      KBN_CUDA_CHECK(cudaEventRecord(ev.end, stream));
      KBN_CUDA_CHECK(cudaEventSynchronize(ev.end));
      float ms = 0;
      KBN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.end));
      if (fastest == 0 || ms < fastest) fastest = ms;
    }
    best.algorithms++;
    if (best.ms == 0 || fastest < best.ms) best.ms = fastest;
  }
  (void)cudaGetLastError();
  return best;
}

#else

GemmCeiling measure_gemm_ceiling(int64_t, int64_t, int64_t, DType, bool) {
  KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA");
}

DeviceInfo query_device(int) { KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA"); }
Ceilings measure_ceilings() { KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA"); }

#endif

}  // namespace kbn::bench
