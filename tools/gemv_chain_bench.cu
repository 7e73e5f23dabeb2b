// gemv_chain_bench: how fast one token's decode weights of Llama-3.1-8B are read by a chain of one-token GEMV kernels
// (32 layers of qkv, o, gate_up, down, then lm_head: 129 launches, 15 GB), each launched with programmatic dependent
// launch in one CUDA graph as the engine's decode graph does, for variants of tasks/baseline/L1/linear.cu's GEMV: warps
// per block and 16-byte loads in flight per lane (all issued before the dependent-launch wait, as the baseline does).
// Prints ms per token and the read rate per variant, beside the device's copy rate (cudaMemcpy, read + write) and a
// plain streaming read of the same bytes. Weights are random bf16; the outputs are not checked (the variants compute
// the same sums in the same order as the baseline: what differs is only how many loads are in flight).
// Build (repo root): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DKBN_VARIANT=baseline -Itasks/baseline
//   tools/gemv_chain_bench.cu -o gemv_chain_bench
// Run: ./gemv_chain_bench [replays]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "L1/gemv.cuh"  // load_weight, dot16, warp_sum: the baseline GEMV's own

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace kbn::baseline::chain_bench {

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}

// linear.cu's GEMV with kWarps warps per block, kLoads loads in flight per lane and row, and kRows rows per warp (the
// warp's rows streamed side by side: kRows x kLoads loads in flight per lane).
template <int kWarps, int kLoads, int kRows>
__global__ void __launch_bounds__(kWarps * 32)
    gemv(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ weight,
         int n, int k) {
  const int lane = int(threadIdx.x % 32);
  const int row0 = (int(blockIdx.x) * kWarps + int(threadIdx.x / 32)) * kRows;
  if (row0 >= n) return;
  const uint4* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = reinterpret_cast<const uint4*>(weight + int64_t(min(row0 + r, n - 1)) * k);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int kv = k / 8;
  float acc[kRows] = {};
  int i = lane;
  if (i + 32 * (kLoads - 1) < kv) {
    uint4 wv[kRows][kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r][u] = load_weight(w[r] + i + 32 * u);
    pdl_wait();
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint4 xu = __ldg(xv + i + 32 * u);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = dot16<__nv_bfloat16>(wv[r][u], xu, acc[r]);
    }
    i += 32 * kLoads;
  } else {
    pdl_wait();
  }
  for (; i + 32 * (kLoads - 1) < kv; i += 32 * kLoads) {
    uint4 wv[kRows][kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r][u] = load_weight(w[r] + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint4 xu = __ldg(xv + i + 32 * u);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = dot16<__nv_bfloat16>(wv[r][u], xu, acc[r]);
    }
  }
  for (; i < kv; i += 32) {
    const uint4 xu = __ldg(xv + i);
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = dot16<__nv_bfloat16>(load_weight(w[r] + i), xu, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    if (lane == 0 && row0 + r < n) out[row0 + r] = __float2bfloat16(acc[r]);
  }
}

// The same sums with the loads software-pipelined: two register buffers of kLoads vectors per lane, the next chunk's
// loads issued before the current chunk's dot products, so a lane always has a chunk in flight (both first chunks go
// out before the dependent-launch wait).
template <int kWarps, int kLoads>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_pipe(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
              const __nv_bfloat16* __restrict__ weight, int n, int k) {
  const int lane = int(threadIdx.x % 32);
  const int row = int(blockIdx.x) * kWarps + int(threadIdx.x / 32);
  if (row >= n) return;
  const uint4* w = reinterpret_cast<const uint4*>(weight + int64_t(row) * k);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int kv = k / 8;
  constexpr int kChunk = 32 * kLoads;
  const int chunks = kv / kChunk;
  float acc = 0.f;
  uint4 a[kLoads], b[kLoads];
  auto load = [&](uint4 (&dst)[kLoads], int c) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) dst[u] = load_weight(w + c * kChunk + lane + 32 * u);
  };
  auto dot = [&](const uint4 (&src)[kLoads], int c) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) acc = dot16<__nv_bfloat16>(src[u], __ldg(xv + c * kChunk + lane + 32 * u), acc);
  };
  if (chunks > 0) load(a, 0);
  if (chunks > 1) load(b, 1);
  pdl_wait();
  for (int c = 0; c < chunks; c += 2) {
    dot(a, c);
    if (c + 2 < chunks) load(a, c + 2);
    if (c + 1 < chunks) {
      dot(b, c + 1);
      if (c + 3 < chunks) load(b, c + 3);
    }
  }
  for (int i = chunks * kChunk + lane; i < kv; i += 32) acc = dot16<__nv_bfloat16>(load_weight(w + i), __ldg(xv + i), acc);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) out[row] = __float2bfloat16(acc);
}

// A plain streaming read of n 16-byte vectors (a grid-stride sum), the read rate without a GEMV's structure.
__global__ void stream_read(const uint4* __restrict__ p, int64_t n, float* out) {
  float acc = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = load_weight(p + i);
    acc += __uint_as_float(v.x) + __uint_as_float(v.w);
  }
  if (acc == 1.2345f) *out = acc;  // keeps the loads
}

__global__ void fill_random(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // Two bf16 of magnitude below 1/16 (exponent 0x3b..0x3d), random sign and mantissa.
    const uint32_t lo = (h & 0x807fu) | 0x3d00u, hi = ((h >> 16) & 0x807fu) | 0x3c80u;
    p[i] = lo | (hi << 16);
  }
}

struct Shape {
  int n, k;
};

template <int W, int L, int R = 1, bool kPdl = true>
void launch(const Shape& s, __nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, cudaStream_t st) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(unsigned((s.n + W * R - 1) / (W * R)));
  c.blockDim = dim3(W * 32);
  c.stream = st;
  c.attrs = attr;
  c.numAttrs = kPdl ? 1 : 0;
  CHECK(cudaLaunchKernelEx(&c, gemv<W, L, R>, out, x, w, s.n, s.k));
}

template <int W, int L>
void launch_pipe(const Shape& s, __nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, cudaStream_t st) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(unsigned((s.n + W - 1) / W));
  c.blockDim = dim3(W * 32);
  c.stream = st;
  c.attrs = attr;
  c.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&c, gemv_pipe<W, L>, out, x, w, s.n, s.k));
}

using Launcher = void (*)(const Shape&, __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, cudaStream_t);

}  // namespace kbn::baseline::chain_bench

using namespace kbn::baseline::chain_bench;

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // Llama-3.1-8B: hidden 4096, 32 layers; qkv 6144, o 4096, gate_up 2 x 14336, down 14336 -> 4096; lm_head 128256.
  const std::vector<Shape> layer = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  const Shape head{128256, 4096};
  std::vector<std::pair<Shape, __nv_bfloat16*>> chain;
  int64_t bytes = 0;
  auto alloc = [&](Shape s) {
    __nv_bfloat16* w = nullptr;
    const int64_t n = int64_t(s.n) * s.k;
    CHECK(cudaMalloc(&w, size_t(n) * 2));
    fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(w), n / 2, uint32_t(chain.size()) * 7919u);
    chain.push_back({s, w});
    bytes += n * 2;
  };
  for (int l = 0; l < 32; ++l)
    for (const Shape& s : layer) alloc(s);
  alloc(head);
  __nv_bfloat16 *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&x, 14336 * 2));
  CHECK(cudaMalloc(&y, 128256 * 2));
  fill_random<<<16, 256>>>(reinterpret_cast<uint32_t*>(x), 14336 / 2, 99u);
  CHECK(cudaDeviceSynchronize());
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  const double gb = double(bytes) / 1e9;
  std::printf("one token: %zu GEMVs, %.3f GB of weights, %d replays each\n", chain.size(), gb, replays);

  // Ceilings: cudaMemcpy of 2 GB (read + write counted), and a streaming read of the qkv + gate_up weights of 4 layers.
  {
    void *s = nullptr, *d = nullptr;
    const size_t n = size_t(2) << 30;
    CHECK(cudaMalloc(&s, n));
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < 5; ++r) CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("copy rate (cudaMemcpy, read + write): %.0f GB/s\n", 2.0 * 5 * double(n) / 1e9 / (ms / 1e3));
    CHECK(cudaFree(d));
    float* sink = nullptr;
    CHECK(cudaMalloc(&sink, 4));
    const int64_t vec = int64_t(n) / 16;
    stream_read<<<prop.multiProcessorCount * 8, 512, 0, st>>>(static_cast<const uint4*>(s), vec, sink);
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < 5; ++r)
      stream_read<<<prop.multiProcessorCount * 8, 512, 0, st>>>(static_cast<const uint4*>(s), vec, sink);
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("streaming read (grid-stride, 16 B loads): %.0f GB/s\n", 5 * double(n) / 1e9 / (ms / 1e3));
    CHECK(cudaFree(s));
    CHECK(cudaFree(sink));
  }

  struct Variant {
    const char* name;
    Launcher fn;
  };
  const Variant variants[] = {
      {"4 warps, 8 loads (baseline)", launch<4, 8>}, {"4 warps, 4 loads", launch<4, 4>},
      {"4 warps, 16 loads", launch<4, 16>},          {"8 warps, 8 loads", launch<8, 8>},
      {"8 warps, 16 loads", launch<8, 16>},          {"2 warps, 16 loads", launch<2, 16>},
      {"2 warps, 8 loads", launch<2, 8>},            {"4 warps, 12 loads", launch<4, 12>},
      {"4 warps, 8 loads, 2 rows per warp", launch<4, 8, 2>},
      {"4 warps, 4 loads, 2 rows per warp", launch<4, 4, 2>},
      {"8 warps, 4 loads, 2 rows per warp", launch<8, 4, 2>},
      {"4 warps, 8 loads, no dependent launch", launch<4, 8, 1, false>},
      {"pipelined: 4 warps, 2 x 8 loads", launch_pipe<4, 8>},
      {"pipelined: 4 warps, 2 x 4 loads", launch_pipe<4, 4>},
      {"pipelined: 8 warps, 2 x 8 loads", launch_pipe<8, 8>},
      {"4 warps, 8 loads (baseline, again)", launch<4, 8>},
  };
  std::printf("%-40s %10s %10s %8s %s\n", "variant", "ms/token", "GB/s", "vs base", "lm_head output");
  double base_ms = 0;
  std::vector<uint16_t> first(128256), got(128256);
  for (const Variant& v : variants) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (const auto& [s, w] : chain) v.fn(s, y, x, w, st);
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < replays; ++r) CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    const double per = double(ms) / replays;
    // The last GEMV's output (lm_head, the same inputs every replay): every variant sums in the baseline's order.
    CHECK(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost));
    const bool first_variant = base_ms == 0;
    if (first_variant) {
      base_ms = per;
      first = got;
    }
    std::printf("%-40s %10.3f %10.0f %7.3fx %s\n", v.name, per, gb / (per / 1e3), base_ms / per,
                first_variant ? "reference" : (got == first ? "same bits" : "DIFFERS"));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
  }
  return 0;
}
