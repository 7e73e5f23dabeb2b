#pragma once
// Warp-level tensor-core and async-copy helpers (sm_80+ PTX: cp.async, ldmatrix, mma.sync m16n8k16) shared by
// the paged attention kernels. Included by their .cu files under KBN_WITH_CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kbn/cuda_check.h"
#include "kbn/dtype.h"
#include "kbn/error.h"

namespace kbn::KBN_VARIANT {
namespace {

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16-byte global -> shared copy that bypasses L1; with valid == false it writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 address the rows of matrix i, and lane l receives row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of each matrix (the transposed variant: row 2 (l % 4) and 2 (l % 4) + 1 of column
// l / 4), which is exactly the m16n8k16 A / B operand fragment layout.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] * b[16x8], fp32 accumulate. Fragments (g = lane / 4, t = lane % 4):
//   a: {(g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..2t+9), (g+8, 2t+8..2t+9)}   (row, k)
//   b: {(2t..2t+1, g), (2t+8..2t+9, g)}                                         (k, col)
//   c: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}                             (row, col)
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit values, `lo` in the low half (the lower column of a fragment pair).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Element offset of 16-byte chunk `chunk` of row `row` in a shared [rows, kHeadDim] tile. Chunks are XOR-swizzled
// by row % 8 so that the eight rows one ldmatrix phase reads (same logical chunk) land in eight different bank
// groups, and so do the cp.async writes.
template <int kHeadDim>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// The head sizes the tensor-core kernels are instantiated for, declared once: f(std::integral_constant<int, D>)
// or an error naming the set.
template <class F>
void dispatch_head_size(int64_t head_size, const char* op, F&& f) {
  switch (head_size) {
    case 64:
      f(std::integral_constant<int, 64>{});
      return;
    case 128:
      f(std::integral_constant<int, 128>{});
      return;
    default:
      KBN_FAIL(op, ": head_size ", head_size, " has no tensor-core kernel; supported: 64, 128");
  }
}

// True when the tensor-core kernels handle (dtype, head_size); otherwise the generic kernel runs. Keep the head
// sizes in step with dispatch_head_size just above.
inline bool tensor_core_attention_supports(DType dt, int64_t head_size) {
  return (dt == DType::bf16 || dt == DType::f16) && (head_size == 64 || head_size == 128);
}

// What a launch needs to know of a kernel that never changes between launches on one device: its dynamic
// shared-memory opt-in (set here) and its occupancy. Queried once per (kernel, device): otherwise every launch
// (every decode step of every layer) pays for three driver calls, and none of them is stream work a CUDA graph
// could hold. The caller launches on `device` (its current device).
struct KernelLaunchFacts {
  int num_sms = 0;
  int blocks_per_sm = 0;
};

inline const KernelLaunchFacts& kernel_launch_facts(const void* kernel, int device, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, KernelLaunchFacts> facts;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (auto it = facts.find(key); it != facts.end()) return it->second;
  KernelLaunchFacts f;
  KBN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  KBN_CUDA_CHECK(cudaDeviceGetAttribute(&f.num_sms, cudaDevAttrMultiProcessorCount, device));
  KBN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.blocks_per_sm, kernel, threads, smem));
  return facts.emplace(key, f).first->second;
}

// True when this binary's image of `kernel` for `device` is Hopper code (sm_90 / sm_90a; cudaFuncGetAttributes reports
// the image the runtime picked): the attention ops then launch their Hopper kernels, any other GPU their mma.sync
// ones. A missing image is not an error. Decided once per (kernel, device).
inline bool runs_sm90_image(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) (void)cudaGetLastError();
  int major = 0;
  KBN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return cache.emplace(key, err == cudaSuccess && major == 9 && attr.binaryVersion == 90).first->second;
}

}  // namespace
}  // namespace kbn::KBN_VARIANT
