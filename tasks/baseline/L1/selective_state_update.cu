#include "L1/selective_state_update.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "kbn/forward_context.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/device_errors.h"
#include "kbn/pdl.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: raw pointers, strides in elements, a stream ----

struct SsuParams {
  void* state;             // [num_slots, num_heads, head_dim, state_size] contiguous, in S
  const void* x;           // [batch, num_heads, head_dim] token stride x_stride, heads and channels packed, in T
  const void* dt;          // [batch, num_heads] token stride dt_stride, in T
  const float* A;          // [num_heads]
  const float* D;          // [num_heads] or nullptr
  const float* dt_bias;    // [num_heads] or nullptr
  const void* B;           // [batch, n_groups, state_size] token stride B_stride, groups packed, in T
  const void* C;           // [batch, n_groups, state_size] token stride C_stride, groups packed, in T
  const int32_t* indices;  // [batch]
  void* out;               // [batch, num_heads, head_dim] contiguous, in T
  int64_t x_stride, dt_stride, B_stride, C_stride;
  int num_heads, head_dim, state_size, heads_per_group, num_slots;
  int lanes;         // threads per state row: a power of two <= 32, at most the row's chunks
  int rows_per_cta;  // head_dim rows of one CTA: (blockDim.x / lanes) * kSsuRows
  int slices;        // CTAs per head: gridDim.x = num_heads * slices
  bool softplus;
  float dt_min, dt_max;
  DeviceErrorRecord* error;
  int32_t slot_code;
};

constexpr int kSsuRows = 4;  // state rows per thread: 4 state loads in flight per thread
constexpr int kSsuMaxThreads = 128;

// kV values of T, loaded as stored in accesses of at most 16 bytes (p aligned to min(16, kV * sizeof(T)) bytes) and
// converted where used: B and C then hold half the registers of fp32 copies for 16-bit activations.
template <class T, int kV>
struct alignas(kV * sizeof(T) >= 16 ? 16 : kV * sizeof(T)) RawValues {
  T v[kV];
  __device__ __forceinline__ void load(const T* p) {
    constexpr int kBytes = kV * int(sizeof(T));
    if constexpr (kBytes > 16) {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<Vec16<T>*>(v)[i] = reinterpret_cast<const Vec16<T>*>(p)[i];
    } else {
      *this = *reinterpret_cast<const RawValues*>(p);
    }
  }
};

// CTAs per SM the register allocation must allow. The kernel is a stream: what bounds it is the state bytes in
// flight, kSsuRows x 16 per thread. Left to itself ptxas gives the 16-bit kernels 96 registers (5 CTAs per SM, 65%
// of copy bandwidth at Mamba-Codestral's shapes on the H200); held to 64 (8 CTAs, no spills) a kernel of the same
// structure reached 90%. Kernels with a 32-bit x or state keep the default (64 registers would spill there).
template <class T, class S, int kLanes>
constexpr int ssu_min_ctas() {
  return kLanes > 0 && sizeof(T) <= 2 && sizeof(S) <= 2 ? 8 : 1;
}

// State chunks are touched once: loaded and stored with the evict-first hint so they do not push B, C and x out of
// the caches (st.global.cs / ld.global.cs).
template <class C>
__device__ __forceinline__ C load_streaming(const C* p) {
  if constexpr (sizeof(C) == 16) {
    const int4 v = __ldcs(reinterpret_cast<const int4*>(p));
    return *reinterpret_cast<const C*>(&v);
  } else {
    return *p;
  }
}
template <class C>
__device__ __forceinline__ void store_streaming(C* p, const C& c) {
  if constexpr (sizeof(C) == 16)
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&c));
  else
    *p = c;
}

// One chunk of kV state values (16 bytes on the vectorised path, one value on the scalar path).
template <class S, int kV>
struct alignas(kV * sizeof(S)) StateChunk {
  S v[kV];
};

// Grid: x over (head, slice of head_dim rows), y over the batch. A CTA updates rows_per_cta rows of one head's state
// [head_dim, state_size]: `lanes` threads cover a row in chunks of kV values (16 bytes of state), each thread holds
// kSsuRows rows, so it has kSsuRows state loads in flight before it touches any; B and C of the head's group are the
// same for every row and come from L1 after the first warp's loads. Per value: s' = exp(dt' A) s + (dt' x_p) B_n in
// fp32, stored in S; out_p = sum_n s'_n C_n (fp32, reduced across the row's lanes by shuffles) + D x_p.
// NOTE: at Mamba-Codestral's shapes (128 heads, 64 x 128 bf16 states) a CTA of 128 threads owns half a head (16 lanes
// per 256-byte row, 8 row slots of 4 rows each): 256 CTAs at batch 1 with the whole 2 MiB of state in flight at once,
// and the grid grows with the batch (65536 CTAs at 256). With 16-bit x and states the kernel is held to 64 registers
// (ssu_min_ctas): 8 CTAs per SM, 64 KiB of state loads in flight per SM. The op reads and writes each state value
// once; its other traffic (x, dt, B, C, out) is about 1% of that.
// An index outside [0, num_slots) is reported (kbn/device_errors.h) and that sequence left untouched; the index -1
// (kPadStateSlot) marks a padding row (CUDA-graph batches padded to a captured size): its output is zero, no state is
// read.
// Dependent launch (kbn/pdl.cuh): on the fixed-lane path (every common shape) the slot index (step metadata, written
// before the step's first kernel) and the thread's whole share of the state are loaded before the wait, under the
// kernel before (the conv update that writes x, B and C), so the state's DRAM latency overlaps it: the caller's
// contract is that no kernel of the step writes those state rows before this one (the engine's SSM states are written
// only by their layer's scan or state update). Everything else is read, and anything written, after the wait.
template <class T, class S, int kV, int kLanes>
__global__ void __launch_bounds__(kSsuMaxThreads, ssu_min_ctas<T, S, kLanes>())
    selective_state_update_kernel(SsuParams p) {
  // kLanes > 0: the shape the launch checked, a row of exactly kLanes chunks and whole CTAs of rows (no bounds).
  constexpr bool kFixed = kLanes > 0;
  if constexpr (!kFixed) pdl_wait();
  const int lanes = kFixed ? kLanes : p.lanes;
  const int b = blockIdx.y;
  const int h = int(blockIdx.x) / p.slices, slice = int(blockIdx.x) % p.slices;
  const int slot = p.indices[b];
  if (slot == kPadStateSlot) {  // a padding row of a CUDA-graph batch: no state, zero output
    if constexpr (kFixed) pdl_wait();
    T* out = static_cast<T*>(p.out) + (int64_t(b) * p.num_heads + h) * p.head_dim;
    const int rows = min(p.rows_per_cta, p.head_dim - slice * p.rows_per_cta);
    for (int r = int(threadIdx.x); r < rows; r += int(blockDim.x)) out[slice * p.rows_per_cta + r] = from_f32<T>(0.f);
    return;
  }
  if (slot < 0 || slot >= p.num_slots) {
    if constexpr (kFixed) pdl_wait();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
      volatile DeviceErrorRecord* r = p.error;
      r->detail = b;
      r->code = p.slot_code;
    }
    return;
  }
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int row_slots = int(blockDim.x) / lanes;
  const int row0 = slice * p.rows_per_cta + int(threadIdx.x) / lanes;
  const auto in_rows = [&](int row) { return kFixed || row < p.head_dim; };
  S* sh = static_cast<S*>(p.state) + (int64_t(slot) * p.num_heads + h) * p.head_dim * p.state_size;
  using Chunk = StateChunk<S, kV>;
  Chunk s[kSsuRows];
  // The state chunks of column j of the thread's rows: kSsuRows loads in flight.
  const auto load_state = [&](int j) {
#pragma unroll
    for (int i = 0; i < kSsuRows; ++i) {
      const int row = row0 + i * row_slots;
      if (in_rows(row)) s[i] = load_streaming(reinterpret_cast<const Chunk*>(sh + int64_t(row) * p.state_size) + j);
    }
  };
  if constexpr (kFixed) {  // one column per lane: the thread's whole share, before the wait
    load_state(lane);
    pdl_wait();
  }
  const int g = h / p.heads_per_group;
  float dt = to_f32(static_cast<const T*>(p.dt)[int64_t(b) * p.dt_stride + h]) + (p.dt_bias ? p.dt_bias[h] : 0.f);
  if (p.softplus) dt = dt <= 20.f ? log1pf(expf(dt)) : dt;  // torch's softplus (threshold 20)
  dt = fminf(fmaxf(dt, p.dt_min), p.dt_max);
  const float decay = expf(dt * p.A[h]);
  const T* xh = static_cast<const T*>(p.x) + int64_t(b) * p.x_stride + int64_t(h) * p.head_dim;
  const T* Bg = static_cast<const T*>(p.B) + int64_t(b) * p.B_stride + int64_t(g) * p.state_size;
  const T* Cg = static_cast<const T*>(p.C) + int64_t(b) * p.C_stride + int64_t(g) * p.state_size;
  const int cols = kFixed ? kLanes : p.state_size / kV;
  float dot[kSsuRows];
#pragma unroll
  for (int i = 0; i < kSsuRows; ++i) dot[i] = 0.f;
#pragma unroll 1
  for (int j = lane; j < cols; j += lanes) {
    if constexpr (!kFixed) load_state(j);
    RawValues<T, kV> bv, cv;
    bv.load(Bg + j * kV);
    cv.load(Cg + j * kV);
#pragma unroll
    for (int i = 0; i < kSsuRows; ++i) {
      const int row = row0 + i * row_slots;
      if (!in_rows(row)) continue;
      const float dtx = dt * to_f32(xh[row]);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float v = fmaf(decay, to_f32(s[i].v[e]), dtx * to_f32(bv.v[e]));
        dot[i] = fmaf(v, to_f32(cv.v[e]), dot[i]);
        s[i].v[e] = from_f32<S>(v);
      }
      store_streaming(reinterpret_cast<Chunk*>(sh + int64_t(row) * p.state_size) + j, s[i]);
    }
    if constexpr (kFixed) break;
  }
#pragma unroll
  for (int i = 0; i < kSsuRows; ++i)
#pragma unroll
    for (int off = lanes >> 1; off > 0; off >>= 1) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], off);
  if (lane == 0) {
    const float d_skip = p.D ? p.D[h] : 0.f;
    T* out = static_cast<T*>(p.out) + (int64_t(b) * p.num_heads + h) * p.head_dim;
#pragma unroll
    for (int i = 0; i < kSsuRows; ++i) {
      const int row = row0 + i * row_slots;
      if (in_rows(row)) out[row] = from_f32<T>(fmaf(d_skip, to_f32(xh[row]), dot[i]));
    }
  }
}

template <class T, class S, int kV, int kLanes>
void launch_ssu_kernel(const SsuParams& p, int batch, int threads, Stream stream) {
  const dim3 grid{unsigned(p.num_heads * p.slices), unsigned(batch)};
  launch_pdl(selective_state_update_kernel<T, S, kV, kLanes>, grid, threads, 0, stream, p);
  KBN_CUDA_CHECK_LAUNCH();
}

template <class T, class S, int kV>
void launch_selective_state_update(SsuParams p, int batch, Stream stream) {
  const int cols = p.state_size / kV;
  int lanes = 1;
  while (lanes * 2 <= cols && lanes < 32) lanes *= 2;
  const int slots_needed = (p.head_dim + kSsuRows - 1) / kSsuRows;
  int threads = std::min<int64_t>(int64_t(lanes) * slots_needed, kSsuMaxThreads);
  threads = std::max(32, (threads + 31) / 32 * 32);
  p.lanes = lanes;
  p.rows_per_cta = threads / lanes * kSsuRows;
  p.slices = (p.head_dim + p.rows_per_cta - 1) / p.rows_per_cta;
  // The common shapes (state_size 128: 16 lanes of 16-bit or 32 of fp32 chunks; head_dim a multiple of the CTA's
  // rows) get the kernel with the lanes fixed at compile time; the choice depends on the shape only, so a given
  // shape always sums in one order.
  if constexpr (kV > 1) {
    const bool whole = lanes * kV == p.state_size && p.head_dim % p.rows_per_cta == 0;
    if (whole && lanes == 16) return launch_ssu_kernel<T, S, kV, 16>(p, batch, threads, stream);
    if (whole && lanes == 32) return launch_ssu_kernel<T, S, kV, 32>(p, batch, threads, stream);
  }
  launch_ssu_kernel<T, S, kV, 0>(p, batch, threads, stream);
}

bool aligned_to(const void* p, int64_t stride_elems, size_t esize, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0 && (stride_elems * int64_t(esize)) % bytes == 0;
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

SelectiveStateUpdate::SelectiveStateUpdate(bool dt_softplus, double dt_min, double dt_max)
    : dt_softplus_(dt_softplus), dt_min_(dt_min), dt_max_(dt_max) {
  KBN_CHECK(!std::isnan(dt_min) && !std::isnan(dt_max) && dt_min <= dt_max,
            "SelectiveStateUpdate: arguments 'dt_min' (", dt_min, ") and 'dt_max' (", dt_max,
            ") must be numbers with dt_min <= dt_max");
}

namespace {

// Every dimension after the first is packed (strides of a contiguous tensor); the token stride is free.
void check_inner_packed(const Tensor& t, const char* op, const char* arg) {
  int64_t expected = 1;
  bool ok = true;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    ok = ok && (t.size(d) <= 1 || t.stride(d) == expected);
    expected *= t.size(d);
  }
  KBN_CHECK(ok, op, ": argument '", arg,
            "' must be packed after its token dimension (only the token stride free), got ", t.str());
}

void check_per_head(const Tensor& t, const char* op, const char* arg, int64_t num_heads, const Tensor& x) {
  check_rank(t, op, arg, 1, "[num_heads]");
  check_size(t, op, arg, 0, num_heads, "num_heads");
  check_dtype(t, op, arg, {DType::f32});
  check_contiguous(t, op, arg);
  check_same_device(x, t, op, "x", arg);
}

}  // namespace

Tensor SelectiveStateUpdate::forward(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A,
                                     const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                                     const Tensor& state_batch_indices) {
  constexpr const char* op = "selective_state_update";
  check_rank(x, op, "x", 3, "[batch, num_heads, head_dim]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_inner_packed(x, op, "x");
  const int64_t batch = x.size(0), nh = x.size(1), P = x.size(2);
  check_rank(state, op, "state", 4, "[num_slots, num_heads, head_dim, state_size]");
  check_dtype(state, op, "state", {DType::f32, DType::f16, DType::bf16});
  check_size(state, op, "state", 1, nh, "num_heads");
  check_size(state, op, "state", 2, P, "head_dim");
  check_contiguous(state, op, "state");
  check_same_device(x, state, op, "x", "state");
  const int64_t N = state.size(3), num_slots = state.size(0);
  check_rank(dt, op, "dt", 2, "[batch, num_heads]");
  check_size(dt, op, "dt", 0, batch, "batch");
  check_size(dt, op, "dt", 1, nh, "num_heads");
  check_same_dtype(x, dt, op, "x", "dt");
  check_last_dim_contiguous(dt, op, "dt");
  check_same_device(x, dt, op, "x", "dt");
  for (const auto& [t, name] : {std::pair{&B, "B"}, {&C, "C"}}) {
    check_rank(*t, op, name, 3, "[batch, n_groups, state_size]");
    check_size(*t, op, name, 0, batch, "batch");
    check_size(*t, op, name, 2, N, "state_size");
    check_same_dtype(x, *t, op, "x", name);
    check_inner_packed(*t, op, name);
    check_same_device(x, *t, op, "x", name);
  }
  const int64_t G = B.size(1);
  check_size(C, op, "C", 1, G, "n_groups");
  KBN_CHECK(G >= 1 && nh % G == 0, op, ": num_heads (", nh, ", argument 'x') must be a multiple of n_groups (", G,
            ", argument 'B')");
  check_per_head(A, op, "A", nh, x);
  if (D.defined()) check_per_head(D, op, "D", nh, x);
  if (dt_bias.defined()) check_per_head(dt_bias, op, "dt_bias", nh, x);
  check_rank(state_batch_indices, op, "state_batch_indices", 1, "[batch]");
  check_size(state_batch_indices, op, "state_batch_indices", 0, batch, "batch");
  check_dtype(state_batch_indices, op, "state_batch_indices", {DType::i32});
  check_contiguous(state_batch_indices, op, "state_batch_indices");
  check_same_device(x, state_batch_indices, op, "x", "state_batch_indices");
  Tensor out = Tensor::empty({batch, nh, P}, x.dtype(), x.device());
  if (x.is_cpu()) {
    // Distinct slots, checked on the host values (the kernel cannot without a synchronisation).
    check_distinct_slots(state_batch_indices, op, "state_batch_indices", num_slots);
    Tensor s = state;
    reference::selective_state_update(out, s, x, dt, A, B, C, D, dt_bias, {dt_softplus_, dt_min_, dt_max_},
                                      state_batch_indices);
    return out;
  }
#ifdef KBN_WITH_CUDA
  if (batch == 0 || nh == 0 || P == 0) return out;
  KBN_CHECK(batch <= 65535, op, ": argument 'x' has ", batch, " rows; the kernel's grid takes at most 65535");
  KBN_CHECK(nh * P <= std::numeric_limits<int>::max() && N <= std::numeric_limits<int>::max() &&
                num_slots <= std::numeric_limits<int>::max() &&
                nh * ((P + kSsuRows - 1) / kSsuRows) < (int64_t(1) << 31),
            op, ": argument 'state' ", state.str(), " is too large for the kernel's 32-bit indices");
  static const int32_t slot_code = device_error_code(
      "selective_state_update: argument 'state_batch_indices'[{detail}] is not a slot of 'state' (indices must lie in "
      "[0, num_slots)); that row's output and state were not written");
  const SsuParams p{.state = state.data_ptr(),
                    .x = x.data_ptr(),
                    .dt = dt.data_ptr(),
                    .A = A.data<float>(),
                    .D = D.defined() ? D.data<float>() : nullptr,
                    .dt_bias = dt_bias.defined() ? dt_bias.data<float>() : nullptr,
                    .B = B.data_ptr(),
                    .C = C.data_ptr(),
                    .indices = state_batch_indices.data<int32_t>(),
                    .out = out.data_ptr(),
                    .x_stride = x.stride(0),
                    .dt_stride = dt.stride(0),
                    .B_stride = B.stride(0),
                    .C_stride = C.stride(0),
                    .num_heads = int(nh),
                    .head_dim = int(P),
                    .state_size = int(N),
                    .heads_per_group = int(nh / G),
                    .num_slots = int(num_slots),
                    .lanes = 1,
                    .rows_per_cta = kSsuRows,
                    .slices = 1,
                    .softplus = dt_softplus_,
                    .dt_min = float(dt_min_),
                    .dt_max = float(dt_max_),
                    .error = device_error_record(),
                    .slot_code = slot_code};
  dispatch_float16_32(x.dtype(), op, "x", [&](auto t) {
    using T = decltype(t);
    dispatch_float16_32(state.dtype(), op, "state", [&](auto s) {
      using S = decltype(s);
      constexpr int kV = Vec16<S>::N;
      // 16-byte state chunks when a row splits into them; B and C then load kV values at once.
      const int64_t bc_align = std::min<int64_t>(16, kV * int64_t(sizeof(T)));
      // The vector and scalar paths sum in different orders, so the result must not depend on how B and C happen to
      // be laid out: when only their alignment stands in the way, they are copied (batch x G x N values, ~1% of the
      // state traffic) and the vector path runs.
      const bool vec_shape = N % kV == 0 && reinterpret_cast<uintptr_t>(p.state) % 16 == 0;
      SsuParams q = p;
      Tensor Bc, Cc;
      if (vec_shape &&
          !(aligned_to(q.B, q.B_stride, sizeof(T), bc_align) && aligned_to(q.C, q.C_stride, sizeof(T), bc_align))) {
        Bc = B.contiguous();
        Cc = C.contiguous();
        q.B = Bc.data_ptr();
        q.C = Cc.data_ptr();
        q.B_stride = Bc.stride(0);
        q.C_stride = Cc.stride(0);
      }
      if (vec_shape)
        launch_selective_state_update<T, S, kV>(q, int(batch), current_stream());
      else
        launch_selective_state_update<T, S, 1>(q, int(batch), current_stream());
    });
  });
#endif
  return out;
}

}  // namespace kbn::KBN_VARIANT
