#pragma once
// Warp-level tensor-core and async-copy helpers (sm_80+ PTX: cp.async, ldmatrix, mma.sync m16n8k16) shared by
// the paged attention kernels. Included by their .cu files under KBN_WITH_CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kbn/cuda_check.h"
#include "kbn/dtype.h"
#include "kbn/error.h"
#include "kbn/tensor.h"

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

// The per-layer attention features of the tensor-core kernels (vLLM's per_layer_sliding_window, logits_soft_cap,
// sinks; reference::AttentionFeatures has the math). Runtime values, not template parameters: a window costs an
// integer test per tile (a per-element mask only on the tiles its edge crosses), soft-capping a tanh per score,
// sinks one exponential per row at the end, so no kernel is instantiated twice for them.
struct AttnFeatures {
  int window = 0;          // > 0: the query at position i sees keys i - window + 1 .. i; 0: every key up to i
  float cap_in = 0.f;      // soft cap (0: none): a raw score q.k becomes cap_out * tanh(q.k * cap_in), which is
  float cap_out = 0.f;     // cap * tanh(scale q.k / cap) in the exp2 domain: cap_in = scale / cap, cap_out = cap log2 e
  const float* sinks = nullptr;  // [num_heads] f32 logits (natural-log domain) that join each head's denominator
  float v_scale = 1.f;     // fp8 values' per-tensor scale (vLLM's v_scale): multiplies the normalised output
};

// The features for a launch; `sinks_f32` keeps the f32 copy of the sinks alive until the launch is enqueued.
// `scale` is the softmax scale with any k_scale folded in; `v_scale` the values' scale (1 for unscaled pages).
inline AttnFeatures attn_features(int64_t sliding_window, double logits_soft_cap, double scale, const Tensor* sinks,
                                  Tensor& sinks_f32, float v_scale = 1.f) {
  AttnFeatures f;
  f.v_scale = v_scale;
  f.window = int(std::min<int64_t>(sliding_window, INT_MAX));  // a window past INT_MAX keys masks nothing
  if (logits_soft_cap > 0) {
    f.cap_in = float(scale / logits_soft_cap);
    f.cap_out = float(logits_soft_cap * 1.4426950408889634);
  }
  if (sinks) {
    sinks_f32 = sinks->to(DType::f32).contiguous();
    f.sinks = sinks_f32.data<float>();
  }
  return f;
}

// The first key a query at position `pos` sees under the window (INT_MIN without one).
__device__ __forceinline__ int window_first_key(const AttnFeatures& f, int pos) {
  return f.window > 0 ? pos - f.window + 1 : INT_MIN;
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Soft-caps `n` raw scores in place, leaving them in the exp2 domain; the softmax then scales them by 1.
template <int kN>
__device__ __forceinline__ void soft_cap_scores(float* s, const AttnFeatures& f) {
#pragma unroll
  for (int i = 0; i < kN; ++i) s[i] = f.cap_out * tanh_approx(s[i] * f.cap_in);
}

// The sink of query head `head` as a term of a row's softmax denominator whose running maximum (exp2 domain) is
// `row_max`: 2^(sink log2 e - row_max). 0 without sinks or for a -inf sink; +inf (an output of 0) for a row that saw
// no key, as the softmax over the sink alone gives.
__device__ __forceinline__ float sink_term(const AttnFeatures& f, int head, float row_max) {
  if (!f.sinks) return 0.f;
  const float sink = f.sinks[head] * 1.4426950408889634f;
  return sink == -INFINITY ? 0.f : exp2f(sink - row_max);
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
