#include "L1/causal_conv1d_update.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "kbn/forward_context.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/causal_conv1d.cuh"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in elements, a stream ----

struct ConvUpdateParams {
  void* out;               // [batch, dim] contiguous
  const void* x;           // [batch, dim] row stride x_stride, channels contiguous
  void* conv_states;       // [num_slots, width - 1, dim] contiguous
  const void* weight;      // [dim, width] contiguous
  const void* bias;        // [dim] or nullptr
  const int32_t* indices;  // [batch]
  int64_t x_stride;
  int batch, dim, num_slots;
  bool silu;
  DeviceErrorRecord* error;
  int32_t slot_code;
};

constexpr int kUpdateThreads = 128;

// Grid: x over vectors of kN channels (kUpdateThreads per CTA), y over the batch. A thread reads its channels' kW - 1
// state rows, the new input and the taps (all independent loads, in flight together), writes the output and the
// state shifted by one row. Memory-bound: the state rows are read and written once, x read once, out written once;
// the weights [dim, kW] are shared by every sequence and stay in L2.
// NOTE: one CTA per (1024 channels, sequence) gives 10 CTAs per sequence at Mamba-Codestral's 10240 channels, so
// from batch 16 on the grid covers the 132 SMs; below that the op is latency-bound (60 KiB of state per sequence).
// An index outside [0, num_slots) is reported (kbn/device_errors.h) and its row left unwritten; the index -1
// (kPadStateSlot, a padding row of a CUDA-graph batch) gets a zero output and touches no state.
// Dependent launch (kbn/pdl.cuh): the slot index (step metadata, written before the step's first kernel), the state
// rows and the taps (parameters) are loaded before the wait, under the kernel before (the in_proj that writes x):
// the caller's contract is that no kernel of the step writes the rows this one reads before it (the engine's conv
// states are written only by their layer's conv ops). x is read, and anything written, after the wait.
template <class T, int kN, int kW>
__global__ void __launch_bounds__(kUpdateThreads) causal_conv1d_update_kernel(ConvUpdateParams p) {
  constexpr int kH = kW - 1;
  const int b = blockIdx.y;
  const int64_t c = (int64_t(blockIdx.x) * kUpdateThreads + threadIdx.x) * kN;
  if (c >= p.dim) return;
  const int slot = p.indices[b];
  if (slot == kPadStateSlot) {  // a padding row of a CUDA-graph batch: no state, zero output
    pdl_wait();
    const float zero[kN] = {};
    store_channels<T, kN>(static_cast<T*>(p.out) + int64_t(b) * p.dim + c, zero);
    return;
  }
  if (slot < 0 || slot >= p.num_slots) {
    pdl_wait();
    if (c == 0) record_device_error(p.error, p.slot_code, b);
    return;
  }
  T* state = static_cast<T*>(p.conv_states) + int64_t(slot) * kH * p.dim + c;
  Channels<T, kN> hist[kH], in;
#pragma unroll
  for (int k = 0; k < kH; ++k) hist[k].load(state + int64_t(k) * p.dim);
  ConvTaps<T, kN, kW> taps;
  taps.load(static_cast<const T*>(p.weight), static_cast<const T*>(p.bias), c);
  pdl_wait();
  in.load(static_cast<const T*>(p.x) + int64_t(b) * p.x_stride + c);
  float o[kN];
  taps.apply(hist, in, p.silu, o);
  store_channels<T, kN>(static_cast<T*>(p.out) + int64_t(b) * p.dim + c, o);
  shift_in(hist, in);
#pragma unroll
  for (int k = 0; k < kH; ++k) hist[k].store(state + int64_t(k) * p.dim);
}

template <class T, int kW>
void launch_causal_conv1d_update(const ConvUpdateParams& p, bool vec, Stream stream) {
  if (p.batch == 0 || p.dim == 0) return;
  constexpr int kVecN = Vec16<T>::N;
  const int per_thread = vec ? kVecN : 1;
  const dim3 grid{unsigned((p.dim / per_thread + kUpdateThreads - 1) / kUpdateThreads), unsigned(p.batch)};
  if (vec)
    launch_pdl(causal_conv1d_update_kernel<T, kVecN, kW>, grid, kUpdateThreads, 0, stream, p);
  else
    launch_pdl(causal_conv1d_update_kernel<T, 1, kW>, grid, kUpdateThreads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

CausalConv1dUpdate::CausalConv1dUpdate(const std::string& activation) : silu_(activation == "silu") {
  KBN_CHECK(activation == "silu" || activation.empty(),
            "CausalConv1dUpdate: argument 'activation' must be \"silu\" or \"\" (none), got \"", activation, "\"");
}

Tensor CausalConv1dUpdate::forward(const Tensor& x, const Tensor& conv_states, const Tensor& weight, const Tensor& bias,
                                   const Tensor& conv_state_indices) {
  constexpr const char* op = "causal_conv1d_update";
  check_rank(x, op, "x", 2, "[batch, dim]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  const int64_t batch = x.size(0), dim = x.size(1);
  check_rank(weight, op, "weight", 2, "[dim, width]");
  check_size(weight, op, "weight", 0, dim, "dim");
  const int64_t width = weight.size(1);
  KBN_CHECK(width >= 2 && width <= 4, op, ": argument 'weight' has width ", width,
            "; supported: 2, 3, 4 (vLLM's causal_conv1d range)");
  check_same_dtype(x, weight, op, "x", "weight");
  check_contiguous(weight, op, "weight");
  check_same_device(x, weight, op, "x", "weight");
  if (bias.defined()) {
    check_rank(bias, op, "bias", 1, "[dim]");
    check_size(bias, op, "bias", 0, dim, "dim");
    check_same_dtype(x, bias, op, "x", "bias");
    check_contiguous(bias, op, "bias");
    check_same_device(x, bias, op, "x", "bias");
  }
  check_rank(conv_states, op, "conv_states", 3, "[num_slots, width - 1, dim]");
  check_size(conv_states, op, "conv_states", 1, width - 1, "width - 1");
  check_size(conv_states, op, "conv_states", 2, dim, "dim");
  check_same_dtype(x, conv_states, op, "x", "conv_states");
  check_contiguous(conv_states, op, "conv_states");
  check_same_device(x, conv_states, op, "x", "conv_states");
  check_rank(conv_state_indices, op, "conv_state_indices", 1, "[batch]");
  check_size(conv_state_indices, op, "conv_state_indices", 0, batch, "batch");
  check_dtype(conv_state_indices, op, "conv_state_indices", {DType::i32});
  check_contiguous(conv_state_indices, op, "conv_state_indices");
  check_same_device(x, conv_state_indices, op, "x", "conv_state_indices");
  const int64_t num_slots = conv_states.size(0);
  Tensor out = Tensor::empty({batch, dim}, x.dtype(), x.device());
  if (x.is_cpu()) {
    // Distinct slots, checked on the host values (the kernel cannot without a synchronisation).
    check_distinct_slots(conv_state_indices, op, "conv_state_indices", num_slots);
    Tensor states = conv_states;
    reference::causal_conv1d_update(out, x, states, weight, bias, conv_state_indices, silu_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  KBN_CHECK(dim <= std::numeric_limits<int>::max() && num_slots <= std::numeric_limits<int>::max(), op,
            ": argument 'conv_states' ", conv_states.str(), " is too large for 32-bit indices");
  KBN_CHECK(batch <= 65535, op, ": argument 'x' has ", batch, " rows; the kernel's grid takes at most 65535");
  static const int32_t slot_code = device_error_code(
      "causal_conv1d_update: argument 'conv_state_indices'[{detail}] is not a slot of 'conv_states' (indices must lie "
      "in [0, num_slots)); that row's output and state were not written");
  const ConvUpdateParams p{.out = out.data_ptr(),
                           .x = x.data_ptr(),
                           .conv_states = conv_states.data_ptr(),
                           .weight = weight.data_ptr(),
                           .bias = bias.defined() ? bias.data_ptr() : nullptr,
                           .indices = conv_state_indices.data<int32_t>(),
                           .x_stride = x.stride(0),
                           .batch = int(batch),
                           .dim = int(dim),
                           .num_slots = int(num_slots),
                           .silu = silu_,
                           .error = device_error_record(),
                           .slot_code = slot_code};
  const size_t es = x.element_size();
  const bool vec = (dim * int64_t(es)) % 16 == 0 && aligned16(p.x) && (p.x_stride * int64_t(es)) % 16 == 0 &&
                   aligned16(p.weight) && (p.bias == nullptr || aligned16(p.bias)) && aligned16(p.conv_states) &&
                   aligned16(p.out);
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
    dispatch_conv_width(width, op, [&](auto w) {
      launch_causal_conv1d_update<decltype(t), decltype(w)::value>(p, vec, current_stream());
    });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
