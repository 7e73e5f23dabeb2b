#pragma once
// Device code shared by causal_conv1d_fn (L1/causal_conv1d_fn.cu) and causal_conv1d_update
// (L1/causal_conv1d_update.cu); included under KBN_WITH_CUDA. A thread owns kN adjacent channels (one 16-byte vector
// of them, or a single channel on the scalar path) and keeps their kW taps, their bias and the window of earlier
// inputs in registers in T, converted to fp32 where used (fp32 math). Both ops run the same supported set of widths
// (kConvWidths) through one dispatch; their op layers refuse other widths before any launch.
#include <cstdint>
#include <type_traits>

#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device_errors.h"
#include "kbn/error.h"

namespace kbn::KBN_VARIANT {
namespace {

// The convolution widths the kernels are built for (vLLM's causal_conv1d kernels take 2..4; Mamba-2 uses 4).
constexpr const char* kConvWidths = "2, 3, 4";

// f(std::integral_constant<int, width>{}) for a supported width; the error names the op and the supported set.
template <class F>
void dispatch_conv_width(int64_t width, const char* op, F&& f) {
  switch (width) {
    case 2:
      f(std::integral_constant<int, 2>{});
      return;
    case 3:
      f(std::integral_constant<int, 3>{});
      return;
    case 4:
      f(std::integral_constant<int, 4>{});
      return;
    default:
      KBN_FAIL(op, ": argument 'weight' has width ", width, "; supported: ", kConvWidths);
  }
}

// kN adjacent channels of T as stored (one 16-byte vector, or one value on the scalar path), converted to fp32 where
// used: the rows in flight, the window of earlier inputs and the taps then take half the registers of fp32 copies for
// 16-bit types, and the registers are what bounds the rows a thread keeps in flight.
template <class T, int kN>
struct Channels {
  static constexpr bool kVec = kN * sizeof(T) == 16;
  static_assert(kVec || kN == 1, "channels come as one 16-byte vector or one value");
  std::conditional_t<kVec, Vec16<T>, T> v;

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kVec)
      v = *reinterpret_cast<const Vec16<T>*>(p);
    else
      v = *p;
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (kVec)
      *reinterpret_cast<Vec16<T>*>(p) = v;
    else
      *p = v;
  }
  __device__ __forceinline__ void zero() {
    if constexpr (kVec) {
#pragma unroll
      for (int j = 0; j < kN; ++j) v.v[j] = from_f32<T>(0.f);
    } else {
      v = from_f32<T>(0.f);
    }
  }
  __device__ __forceinline__ float at(int j) const {
    if constexpr (kVec)
      return to_f32(v.v[j]);
    else
      return to_f32(v);
  }
};

template <class T, int kN>
__device__ __forceinline__ void store_channels(T* p, const float (&in)[kN]) {
  if constexpr (kN * sizeof(T) == 16) {
    Vec16<T> v;
#pragma unroll
    for (int j = 0; j < kN; ++j) v.v[j] = from_f32<T>(in[j]);
    *reinterpret_cast<Vec16<T>*>(p) = v;
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) p[j] = from_f32<T>(in[j]);
  }
}

// The taps of kN channels starting at channel c: weight [dim, kW] row-major holds them as kN * kW consecutive values
// (kW 16-byte vectors on the vectorised path, since c is a multiple of kN), and their bias (0 without one).
template <class T, int kN, int kW>
struct ConvTaps {
  alignas(16) T w[kN * kW];  // channel j's tap k at j * kW + k
  Channels<T, kN> bias;

  __device__ __forceinline__ void load(const T* weight, const T* bias_or_null, int64_t c) {
    const T* src = weight + c * kW;
    if constexpr (kN * sizeof(T) == 16) {
#pragma unroll
      for (int i = 0; i < kW; ++i) reinterpret_cast<Vec16<T>*>(w)[i] = reinterpret_cast<const Vec16<T>*>(src)[i];
    } else {
#pragma unroll
      for (int i = 0; i < kN * kW; ++i) w[i] = src[i];
    }
    if (bias_or_null != nullptr)
      bias.load(bias_or_null + c);
    else
      bias.zero();
  }

  // out = act(bias + sum_{k < kW - 1} w[k] * hist[k] + w[kW - 1] * x): hist holds the kW - 1 earlier inputs,
  // oldest first, x the newest. fp32 throughout; silu with an accurate expf (the kernels are memory-bound).
  __device__ __forceinline__ void apply(const Channels<T, kN> (&hist)[kW - 1], const Channels<T, kN>& x, bool silu,
                                        float (&out)[kN]) const {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      float acc = bias.at(j);
#pragma unroll
      for (int k = 0; k < kW - 1; ++k) acc = fmaf(to_f32(w[j * kW + k]), hist[k].at(j), acc);
      acc = fmaf(to_f32(w[j * kW + kW - 1]), x.at(j), acc);
      out[j] = silu ? acc / (1.f + expf(-acc)) : acc;
    }
  }
};

// The window moves on by one input: the oldest drops out, x becomes the newest earlier input.
template <class T, int kN, int kH>
__device__ __forceinline__ void shift_in(Channels<T, kN> (&hist)[kH], const Channels<T, kN>& x) {
#pragma unroll
  for (int k = 0; k + 1 < kH; ++k) hist[k] = hist[k + 1];
  hist[kH - 1] = x;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Reports bad input the host cannot see without a synchronisation (kbn/device_errors.h): the detail, then the code.
__device__ __forceinline__ void record_device_error(DeviceErrorRecord* record, int32_t code, int64_t detail) {
  volatile DeviceErrorRecord* r = record;
  r->detail = detail;
  r->code = code;
}

}  // namespace
}  // namespace kbn::KBN_VARIANT
