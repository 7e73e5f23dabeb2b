// Standalone experiment (not part of the tree): selective_state_update kernel variants at Codestral's shapes.
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cstdlib>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

constexpr int H = 128, P = 64, N = 128, G = 8, HPG = H / G, KV = 8, LANES = 16;
using bf = __nv_bfloat16;
struct alignas(16) Chunk { bf v[8]; };

struct Prm {
  bf* state; const bf* x; const bf* dt; const float* A; const float* D; const float* dt_bias;
  const bf* B; const bf* C; const int* idx; bf* out;
};

template <bool kStream>
__device__ __forceinline__ Chunk ldst(const Chunk* p) {
  if constexpr (kStream) { int4 v = __ldcs(reinterpret_cast<const int4*>(p)); return *reinterpret_cast<Chunk*>(&v); }
  else return *p;
}
template <bool kStream>
__device__ __forceinline__ void stst(Chunk* p, const Chunk& c) {
  if constexpr (kStream) __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&c));
  else *p = c;
}

// Non-persistent: grid (H * slices, batch); THREADS/16 row slots x R rows each.
template <int R, int THREADS, int MINB, bool kStream>
__global__ void __launch_bounds__(THREADS, MINB) k_rows(Prm p) {
  constexpr int kRowSlots = THREADS / LANES, kRowsPerCta = kRowSlots * R, kSlices = P / kRowsPerCta;
  const int b = blockIdx.y, h = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  const int slot = p.idx[b];
  const int g = h / HPG;
  float dt = __bfloat162float(p.dt[b * H + h]) + p.dt_bias[h];
  dt = dt <= 20.f ? log1pf(expf(dt)) : dt;
  const float decay = expf(dt * p.A[h]);
  const int lane = threadIdx.x % LANES;
  const int row0 = slice * kRowsPerCta + threadIdx.x / LANES;
  Chunk* sh = reinterpret_cast<Chunk*>(p.state + (int64_t(slot) * H + h) * P * N);
  Chunk s[R];
#pragma unroll
  for (int i = 0; i < R; ++i) s[i] = ldst<kStream>(sh + (row0 + i * kRowSlots) * (N / KV) + lane);
  const Chunk bv = reinterpret_cast<const Chunk*>(p.B + (int64_t(b) * G + g) * N)[lane];
  const Chunk cv = reinterpret_cast<const Chunk*>(p.C + (int64_t(b) * G + g) * N)[lane];
  const bf* xh = p.x + (int64_t(b) * H + h) * P;
  float dot[R], xv[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    xv[i] = __bfloat162float(xh[row0 + i * kRowSlots]);
    const float dtx = dt * xv[i];
    dot[i] = 0.f;
#pragma unroll
    for (int e = 0; e < KV; ++e) {
      const float v = fmaf(decay, __bfloat162float(s[i].v[e]), dtx * __bfloat162float(bv.v[e]));
      dot[i] = fmaf(v, __bfloat162float(cv.v[e]), dot[i]);
      s[i].v[e] = __float2bfloat16(v);
    }
    stst<kStream>(sh + (row0 + i * kRowSlots) * (N / KV) + lane, s[i]);
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], off);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < R; ++i)
      p.out[(int64_t(b) * H + h) * P + row0 + i * kRowSlots] = __float2bfloat16(fmaf(p.D[h], xv[i], dot[i]));
  }
}

// Persistent: items (b, h, slice) strided over the grid, the next item's state prefetched into registers.
template <int R, int THREADS, int MINB, bool kStream>
__global__ void __launch_bounds__(THREADS, MINB) k_persist(Prm p, int batch) {
  constexpr int kRowSlots = THREADS / LANES, kRowsPerCta = kRowSlots * R, kSlices = P / kRowsPerCta;
  const int items = batch * H * kSlices;
  const int lane = threadIdx.x % LANES;
  const int rsub = threadIdx.x / LANES;
  Chunk cur[R], nxt[R];
  auto addr = [&](int it, int i) {
    const int b = it / (H * kSlices), rem = it % (H * kSlices), h = rem / kSlices, slice = rem % kSlices;
    const int slot = p.idx[b];
    return reinterpret_cast<Chunk*>(p.state + (int64_t(slot) * H + h) * P * N) +
           (slice * kRowsPerCta + rsub + i * kRowSlots) * (N / KV) + lane;
  };
  int it = blockIdx.x;
  if (it < items) {
#pragma unroll
    for (int i = 0; i < R; ++i) cur[i] = ldst<kStream>(addr(it, i));
  }
  for (; it < items; it += gridDim.x) {
    const int nit = it + gridDim.x;
    if (nit < items) {
#pragma unroll
      for (int i = 0; i < R; ++i) nxt[i] = ldst<kStream>(addr(nit, i));
    }
    const int b = it / (H * kSlices), rem = it % (H * kSlices), h = rem / kSlices, slice = rem % kSlices;
    const int g = h / HPG;
    float dt = __bfloat162float(p.dt[b * H + h]) + p.dt_bias[h];
    dt = dt <= 20.f ? log1pf(expf(dt)) : dt;
    const float decay = expf(dt * p.A[h]);
    const int row0 = slice * kRowsPerCta + rsub;
    const Chunk bv = reinterpret_cast<const Chunk*>(p.B + (int64_t(b) * G + g) * N)[lane];
    const Chunk cv = reinterpret_cast<const Chunk*>(p.C + (int64_t(b) * G + g) * N)[lane];
    const bf* xh = p.x + (int64_t(b) * H + h) * P;
    Chunk* base = addr(it, 0);
    float dot[R], xv[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      xv[i] = __bfloat162float(xh[row0 + i * kRowSlots]);
      const float dtx = dt * xv[i];
      dot[i] = 0.f;
#pragma unroll
      for (int e = 0; e < KV; ++e) {
        const float v = fmaf(decay, __bfloat162float(cur[i].v[e]), dtx * __bfloat162float(bv.v[e]));
        dot[i] = fmaf(v, __bfloat162float(cv.v[e]), dot[i]);
        cur[i].v[e] = __float2bfloat16(v);
      }
      stst<kStream>(base + i * kRowSlots * (N / KV), cur[i]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int off = LANES / 2; off > 0; off >>= 1) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], off);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < R; ++i)
        p.out[(int64_t(b) * H + h) * P + row0 + i * kRowSlots] = __float2bfloat16(fmaf(p.D[h], xv[i], dot[i]));
    }
#pragma unroll
    for (int i = 0; i < R; ++i) cur[i] = nxt[i];
  }
}

__global__ void fill_random(bf* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.f - 0.5f) * 4.f);
  }
}
constexpr int kSlots = 768;  // 1.5 GiB of state: windows rotate so L2 stays cold

template <class F>
float time_it(F f, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a)); f(r + 3); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms * 1000.f);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  const bool rnd = argc > 1;
  int nsm; CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  const size_t state_elems = size_t(kSlots) * H * P * N;
  bf* state; CK(cudaMalloc(&state, state_elems * 2));
  CK(cudaMemset(state, 0, state_elems * 2));
  if (rnd) { fill_random<<<2048, 256>>>(state, state_elems, 1); CK(cudaDeviceSynchronize()); printf("random state\n"); }
  const int maxB = 256;
  bf *x, *dt, *B, *C, *out; float *A, *D, *dtb; int* idx;
  CK(cudaMalloc(&x, maxB * H * P * 2)); CK(cudaMalloc(&dt, maxB * H * 2)); CK(cudaMalloc(&B, maxB * G * N * 2));
  CK(cudaMalloc(&C, maxB * G * N * 2)); CK(cudaMalloc(&out, maxB * H * P * 2));
  CK(cudaMalloc(&A, H * 4)); CK(cudaMalloc(&D, H * 4)); CK(cudaMalloc(&dtb, H * 4));
  CK(cudaMemset(x, 0, maxB * H * P * 2)); CK(cudaMemset(dt, 0, maxB * H * 2)); CK(cudaMemset(B, 0, maxB * G * N * 2));
  CK(cudaMemset(C, 0, maxB * G * N * 2)); CK(cudaMemset(A, 0, H * 4)); CK(cudaMemset(D, 0, H * 4)); CK(cudaMemset(dtb, 0, H * 4));
  // Index sets: window w uses slots [w*B, (w+1)*B) mod kSlots.
  CK(cudaMalloc(&idx, kSlots * 4 * 8));
  std::vector<int> hidx(kSlots * 8);
  for (size_t i = 0; i < hidx.size(); ++i) hidx[i] = int((i * 7) % kSlots);
  CK(cudaMemcpy(idx, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));
  // Copy ceiling: 1 GiB D2D.
  {
    const size_t bytes = size_t(1) << 29;
    char* dst; CK(cudaMalloc(&dst, bytes));
    float us = time_it([&](int) { CK(cudaMemcpyAsync(dst, state, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    printf("copy 512 MiB: %.1f us, %.0f GB/s (read + write)\n", us, 2.0 * bytes / us / 1e3);
    CK(cudaFree(dst));
  }
  const int batches[] = {1, 8, 32, 64, 128, 256};
  auto prm = [&](int r, int batch) {
    Prm p{state, x, dt, A, D, dtb, B, C, idx + (size_t(r) * batch) % (kSlots * 7), out};
    return p;
  };
  for (int batch : batches) {
    const double bytes = 2.0 * batch * H * P * N * 2;
    auto report = [&](const char* name, float us) {
      printf("B=%-4d %-28s %8.2f us  %6.0f GB/s\n", batch, name, us, bytes / us / 1e3);
    };
#define ROWS(R, T, MB, ST)                                                                                  \
    {                                                                                                       \
      constexpr int slices = P / (T / LANES * R);                                                           \
      report("rows R=" #R " T=" #T " minB=" #MB " st=" #ST, time_it([&](int r) {                            \
        k_rows<R, T, MB, ST><<<dim3(H * slices, batch), T>>>(prm(r, batch)); }, 20));                       \
    }
#define PERS(R, T, MB, ST)                                                                                  \
    {                                                                                                       \
      int per_sm; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persist<R, T, MB, ST>, T, 0)); \
      constexpr int slices = P / (T / LANES * R);                                                           \
      const int items = batch * H * slices;                                                                 \
      const int grid = std::min(items, per_sm * nsm);                                                       \
      report("persist R=" #R " T=" #T " minB=" #MB " st=" #ST, time_it([&](int r) {                         \
        k_persist<R, T, MB, ST><<<grid, T>>>(prm(r, batch), batch); }, 20));                                \
    }
    ROWS(4, 128, 1, false)
    ROWS(4, 128, 8, true)
    ROWS(8, 128, 6, false)
    ROWS(8, 128, 6, true)
    PERS(4, 128, 6, false)
    CK(cudaGetLastError());
  }
  {
    int b = 256;
    const double bytes = 2.0 * b * H * P * N * 2;
    float us = time_it([&](int r) {
      CK(cudaMemcpyAsync(state + size_t((r % 2) * 256) * H * P * N, state + size_t(((r + 1) % 3) * 256) * H * P * N,
                         bytes / 2, cudaMemcpyDeviceToDevice)); }, 10);
    printf("copy of the B=256 state bytes: %.1f us, %.0f GB/s\n", us, bytes / us / 1e3);
  }
  return 0;
}
