#include "L1/causal_conv1d_fn.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "L1/causal_conv1d.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in elements, a stream ----

struct ConvFnParams {
  void* out;                         // [num_tokens, dim] contiguous
  const void* x;                     // [num_tokens, dim] row stride x_stride, channels contiguous
  const void* weight;                // [dim, width] contiguous
  const void* bias;                  // [dim] or nullptr
  void* conv_states;                 // [num_slots, width - 1, dim] contiguous
  const int32_t* has_initial_state;  // [num_seqs]
  const int32_t* cache_indices;      // [num_seqs]
  const int32_t* query_start_loc;    // [num_seqs + 1]
  int64_t x_stride;
  int num_tokens, num_seqs, dim, num_slots;
  int tile;  // tokens per tile (gridDim.y walks the tiles), at least width - 1
  bool silu;
  bool starts_in_smem;  // query_start_loc is copied into dynamic shared memory (it fits)
  DeviceErrorRecord* error;
  int32_t slot_code, starts_code;
};

constexpr int kConvThreads = 128;
constexpr int kTokensInFlight = 4;  // x rows loaded before the first of them is used
constexpr int kTargetCtas = 1024;   // about 8 per SM of an H200: tiles shrink until the grid has this many
constexpr int kMinTile = 8, kMaxTile = 64;
constexpr size_t kMaxStartsSmem = 48 * 1024;

// The sequence holding token t: the last s with starts[s] <= t.
__device__ __forceinline__ int sequence_of(const int32_t* starts, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Where a tile boundary at token t really lies: a boundary inside a sequence's first kH tokens (not at its start)
// moves past them. So the CTA that owns a sequence's first token also runs every token whose window reaches into the
// sequence's old conv state, and is the only reader of that slot: it can write the slot's new state without racing
// with any other CTA. Monotone in t, so the moved boundaries still partition the tokens.
template <int kH>
__device__ __forceinline__ int owned_boundary(const int32_t* starts, int num_seqs, int num_tokens, int t) {
  if (t >= num_tokens) return num_tokens;
  const int s = sequence_of(starts, num_seqs, t);
  const int start = starts[s];
  if (t > start && t < start + kH) return min(max(min(start + kH, int(starts[s + 1])), t), num_tokens);
  return t;
}

// Grid: x over vectors of kN channels (kConvThreads per CTA), y over tiles of p.tile tokens. A thread walks its
// tile's tokens on its channels with the kW - 1 previous inputs in registers: at a sequence's first token they come
// from the slot's conv state (has_initial_state) or are zeros, elsewhere from the x rows before the tile. The CTA
// owning a sequence's first token writes the slot's new state: its window after the sequence's last token when that
// lies in the tile, else the last kW - 1 rows of x (the sequence is then longer than kW - 1).
// NOTE: kTokensInFlight rows of x are loaded before any is used, so each thread has that many 16-byte loads in flight
// (bf16 at width 4 takes 128 registers: four CTAs of 128 threads per SM keep 32 KiB of x in flight per SM; eight rows
// in flight spill); tiles shrink to 8 tokens until the grid has kTargetCtas CTAs, so 512 tokens x 10240 channels
// still spread over 640 CTAs. The kW - 1 rows a tile re-reads before its start are its neighbour's, mostly from L2.
// The taps load after the boundaries' copy to shared memory: loading them first overlaps one round trip but takes
// 146 registers (three CTAs per SM).
template <class T, int kN, int kW>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_fn_kernel(ConvFnParams p) {
  constexpr int kH = kW - 1;
  const int64_t c = (int64_t(blockIdx.x) * kConvThreads + threadIdx.x) * kN;
  extern __shared__ int32_t shared_starts[];
  const int32_t* starts = p.query_start_loc;
  if (p.starts_in_smem) {
    for (int i = threadIdx.x; i <= p.num_seqs; i += kConvThreads) shared_starts[i] = p.query_start_loc[i];
    __syncthreads();
    starts = shared_starts;
  }
  // One CTA checks the sequence boundaries (the host cannot look at them without a synchronisation).
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int i = threadIdx.x; i <= p.num_seqs; i += kConvThreads) {
      const bool bad = (i == 0 && starts[0] != 0) || (i > 0 && starts[i] <= starts[i - 1]) ||
                       (i == p.num_seqs && starts[i] != p.num_tokens);
      if (bad) record_device_error(p.error, p.starts_code, i);
    }
  }
  const int t0 = int(blockIdx.y) * p.tile;
  const int a = owned_boundary<kH>(starts, p.num_seqs, p.num_tokens, t0);
  const int b = owned_boundary<kH>(starts, p.num_seqs, p.num_tokens, min(t0 + p.tile, p.num_tokens));
  if (a >= b || c >= p.dim) return;

  const T* x = static_cast<const T*>(p.x) + c;
  T* out = static_cast<T*>(p.out) + c;
  T* states = static_cast<T*>(p.conv_states) + c;
  ConvTaps<T, kN, kW> taps;
  taps.load(static_cast<const T*>(p.weight), static_cast<const T*>(p.bias), c);

  int s = sequence_of(starts, p.num_seqs, a);
  for (int t = a; t < b; ++s) {
    s = min(s, p.num_seqs - 1);  // only bad boundaries (reported above) could walk past the last sequence
    const int start = starts[s];
    const int end = min(max(int(starts[s + 1]), t + 1), p.num_tokens);
    const int stop = min(end, b);
    Channels<T, kN> hist[kH];
    T* state = nullptr;  // the slot this CTA writes: set only at a sequence's first token
    if (t == start) {
      const int slot = p.cache_indices[s];
      if (slot >= 0 && slot < p.num_slots)
        state = states + int64_t(slot) * kH * p.dim;
      else if (c == 0)
        record_device_error(p.error, p.slot_code, s);
      const bool init = state != nullptr && p.has_initial_state[s] != 0;
#pragma unroll
      for (int k = 0; k < kH; ++k) {
        if (init)
          hist[k].load(state + int64_t(k) * p.dim);
        else
          hist[k].zero();
      }
    } else {
#pragma unroll
      for (int k = 0; k < kH; ++k) {
        const int row = t - kH + k;
        if (row >= 0)
          hist[k].load(x + int64_t(row) * p.x_stride);
        else
          hist[k].zero();
      }
    }
    for (; t < stop; t += kTokensInFlight) {
      Channels<T, kN> in[kTokensInFlight];
#pragma unroll
      for (int u = 0; u < kTokensInFlight; ++u)
        if (t + u < stop) in[u].load(x + int64_t(t + u) * p.x_stride);
#pragma unroll
      for (int u = 0; u < kTokensInFlight; ++u) {
        if (t + u < stop) {
          float o[kN];
          taps.apply(hist, in[u], p.silu, o);
          store_channels<T, kN>(out + int64_t(t + u) * p.dim, o);
          shift_in(hist, in[u]);
        }
      }
    }
    t = stop;
    if (state != nullptr) {
      if (stop == end) {
#pragma unroll
        for (int k = 0; k < kH; ++k) hist[k].store(state + int64_t(k) * p.dim);
      } else {
#pragma unroll
        for (int k = 0; k < kH; ++k) {
          Channels<T, kN> v;
          v.load(x + int64_t(max(end - kH + k, 0)) * p.x_stride);
          v.store(state + int64_t(k) * p.dim);
        }
      }
    }
  }
}

template <class T, int kW>
void launch_causal_conv1d_fn(ConvFnParams p, bool vec, Stream stream) {
  constexpr int kVecN = Vec16<T>::N;
  const int per_thread = vec ? kVecN : 1;
  const int64_t blocks_x = (p.dim / per_thread + kConvThreads - 1) / kConvThreads;
  int tile = kMaxTile;
  while (tile > kMinTile && (p.num_tokens + tile - 1) / tile * blocks_x < kTargetCtas) tile /= 2;
  p.tile = tile;
  const size_t smem = size_t(p.num_seqs + 1) * sizeof(int32_t);
  p.starts_in_smem = smem <= kMaxStartsSmem;
  const dim3 grid{unsigned(blocks_x), unsigned((p.num_tokens + tile - 1) / tile)};
  const size_t dyn = p.starts_in_smem ? smem : 0;
  if (vec)
    causal_conv1d_fn_kernel<T, kVecN, kW><<<grid, kConvThreads, dyn, stream>>>(p);
  else
    causal_conv1d_fn_kernel<T, 1, kW><<<grid, kConvThreads, dyn, stream>>>(p);
  KBN_CUDA_CHECK_LAUNCH();
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

CausalConv1dFn::CausalConv1dFn(const std::string& activation) : silu_(activation == "silu") {
  KBN_CHECK(activation == "silu" || activation.empty(),
            "CausalConv1dFn: argument 'activation' must be \"silu\" or \"\" (none), got \"", activation, "\"");
}

Tensor CausalConv1dFn::forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& conv_states,
                               const Tensor& has_initial_state, const Tensor& cache_indices,
                               const Tensor& query_start_loc) {
  constexpr const char* op = "causal_conv1d_fn";
  check_rank(x, op, "x", 2, "[num_tokens, dim]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_last_dim_contiguous(x, op, "x");
  const int64_t T = x.size(0), dim = x.size(1);
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
  check_rank(query_start_loc, op, "query_start_loc", 1, "[num_seqs + 1]");
  check_dtype(query_start_loc, op, "query_start_loc", {DType::i32});
  check_contiguous(query_start_loc, op, "query_start_loc");
  check_same_device(x, query_start_loc, op, "x", "query_start_loc");
  KBN_CHECK(query_start_loc.size(0) >= 1, op, ": argument 'query_start_loc' must hold num_seqs + 1 >= 1 entries, got ",
            query_start_loc.str());
  const int64_t num_seqs = query_start_loc.size(0) - 1;
  KBN_CHECK(T >= num_seqs && (num_seqs > 0 || T == 0), op, ": argument 'x' has ", T, " tokens for ", num_seqs,
            " sequences (each sequence has at least one token, every token a sequence)");
  for (const auto& [t, name] :
       {std::pair{&has_initial_state, "has_initial_state"}, {&cache_indices, "cache_indices"}}) {
    check_rank(*t, op, name, 1, "[num_seqs]");
    check_size(*t, op, name, 0, num_seqs, "num_seqs");
    check_dtype(*t, op, name, {DType::i32});
    check_contiguous(*t, op, name);
    check_same_device(x, *t, op, "x", name);
  }
  const int64_t num_slots = conv_states.size(0);
  Tensor out = Tensor::empty({T, dim}, x.dtype(), x.device());
  if (num_seqs == 0) return out;  // no prefill in the step: nothing to convolve, no state to touch
  if (x.is_cpu()) {
    // What the kernel cannot check without a synchronisation, checked here on the host values.
    const std::vector<int64_t> q = query_start_loc.to_ints();
    KBN_CHECK(q.front() == 0 && q.back() == T, op, ": argument 'query_start_loc' must run from 0 to num_tokens (", T,
              "), got ", q.front(), " .. ", q.back());
    for (size_t i = 1; i < q.size(); ++i)
      KBN_CHECK(q[i] > q[i - 1], op,
                ": argument 'query_start_loc' must increase (every sequence at least one token), "
                "entries ",
                i - 1, " and ", i, " are ", q[i - 1], " and ", q[i]);
    check_distinct_slots(cache_indices, op, "cache_indices", num_slots);
    Tensor states = conv_states;
    reference::causal_conv1d_fn(out, x, weight, bias, states, has_initial_state, cache_indices, query_start_loc, silu_);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (dim == 0) return out;
  KBN_CHECK(dim <= std::numeric_limits<int>::max() && T <= std::numeric_limits<int>::max() &&
                num_slots <= std::numeric_limits<int>::max(),
            op, ": argument 'x' ", x.str(), " or 'conv_states' ", conv_states.str(),
            " is too large for 32-bit indices");
  static const int32_t slot_code = device_error_code(
      "causal_conv1d_fn: argument 'cache_indices'[{detail}] is not a slot of 'conv_states' (indices must lie in [0, "
      "num_slots)); that sequence's state was neither read nor written");
  static const int32_t starts_code = device_error_code(
      "causal_conv1d_fn: argument 'query_start_loc' entry {detail} is out of order (it must run from 0 to num_tokens, "
      "every sequence at least one token)");
  ConvFnParams p{.out = out.data_ptr(),
                 .x = x.data_ptr(),
                 .weight = weight.data_ptr(),
                 .bias = bias.defined() ? bias.data_ptr() : nullptr,
                 .conv_states = conv_states.data_ptr(),
                 .has_initial_state = has_initial_state.data<int32_t>(),
                 .cache_indices = cache_indices.data<int32_t>(),
                 .query_start_loc = query_start_loc.data<int32_t>(),
                 .x_stride = x.stride(0),
                 .num_tokens = int(T),
                 .num_seqs = int(num_seqs),
                 .dim = int(dim),
                 .num_slots = int(num_slots),
                 .tile = kMaxTile,
                 .silu = silu_,
                 .starts_in_smem = false,
                 .error = device_error_record(),
                 .slot_code = slot_code,
                 .starts_code = starts_code};
  KBN_CHECK(T <= 65535 * int64_t(kMaxTile), op, ": argument 'x' has ", T, " tokens; the kernel's grid takes at most ",
            65535 * int64_t(kMaxTile));
  const size_t es = x.element_size();
  const bool vec = (dim * int64_t(es)) % 16 == 0 && aligned16(p.x) && (p.x_stride * int64_t(es)) % 16 == 0 &&
                   aligned16(p.weight) && (p.bias == nullptr || aligned16(p.bias)) && aligned16(p.conv_states) &&
                   aligned16(p.out);
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
    dispatch_conv_width(
        width, op, [&](auto w) { launch_causal_conv1d_fn<decltype(t), decltype(w)::value>(p, vec, current_stream()); });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
