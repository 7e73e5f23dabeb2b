#pragma once
// The rotary embedding's arithmetic on the GPU, one definition for the kernels that must give the same bits:
// rotary_embedding, and the fused ops that replace it on some paths (fused_qk_norm_rope, fused_rope_kvcache). Included
// only by CUDA translation units.
#include <cstdint>

#include "kbn/cuda_dispatch.cuh"

namespace kbn {

// The pair (x, y) (NeoX: features j and j + rotary_dim / 2; GPT-J: 2j and 2j + 1) rotated by the angle whose cosine and
// sine are c and s: x' = x c - y s, y' = y c + x s, in fp32 of the values as stored, rounded to T. Each product and the
// sum are rounded on their own: left to itself the compiler contracts them into a fused multiply-add, differently at
// different call sites, and two kernels' f32 outputs then differ by an ulp (session 28, on an H100).
template <class T>
__device__ __forceinline__ T rope_rotated_x(T x, T y, T c, T s) {
  return from_f32<T>(__fsub_rn(__fmul_rn(to_f32(x), to_f32(c)), __fmul_rn(to_f32(y), to_f32(s))));
}
template <class T>
__device__ __forceinline__ T rope_rotated_y(T x, T y, T c, T s) {
  return from_f32<T>(__fadd_rn(__fmul_rn(to_f32(y), to_f32(c)), __fmul_rn(to_f32(x), to_f32(s))));
}

// The 16-byte vector that lane (this lane ^ mask) holds; every lane of the warp must call it (a NeoX partner half
// when a warp holds a head in 16-byte vectors, one per lane).
template <class T>
__device__ __forceinline__ Vec16<T> shfl_xor_vec16(const Vec16<T>& v, int mask) {
  uint32_t words[4], other[4];
  __builtin_memcpy(words, &v, 16);
#pragma unroll
  for (int w = 0; w < 4; ++w) other[w] = __shfl_xor_sync(0xffffffffu, words[w], mask);
  Vec16<T> r;
  __builtin_memcpy(&r, other, 16);
  return r;
}

// A NeoX head of kHeadDim features held by a warp in 16-byte vectors (lane l: features [l N, l N + N), N = 16 /
// sizeof(T); lanes >= kHeadDim / N hold none and must not call this): lane `lane`'s vector v rotated for position pos,
// given `other`, the partner half's vector (shfl_xor_vec16(v, kHeadDim / N / 2)), and the table cos_sin
// [max_position, kHeadDim] (cos | sin). A position outside [0, max_position) leaves v as it is, as rotary_embedding
// does.
template <class T, int kHeadDim>
__device__ __forceinline__ Vec16<T> rope_neox_lane(const Vec16<T>& v, const Vec16<T>& other, int lane, int64_t pos,
                                                   const T* cos_sin, int64_t max_position) {
  using V = Vec16<T>;
  constexpr int kHalf = kHeadDim / V::N / 2;  // lanes between a NeoX pair's two features
  if (pos < 0 || pos >= max_position) return v;
  const bool first_half = lane < kHalf;
  const T* cos = cos_sin + pos * kHeadDim;
  const V c = reinterpret_cast<const V*>(cos)[lane % kHalf];
  const V s = reinterpret_cast<const V*>(cos + kHeadDim / 2)[lane % kHalf];
  V r;
#pragma unroll
  for (int j = 0; j < V::N; ++j)
    r.v[j] = first_half ? rope_rotated_x(v.v[j], other.v[j], c.v[j], s.v[j])
                        : rope_rotated_y(other.v[j], v.v[j], c.v[j], s.v[j]);
  return r;
}

}  // namespace kbn
