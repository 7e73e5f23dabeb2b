#pragma once
// Mamba-2's state update for one token per sequence (vLLM selective_state_update, decode, with vLLM's per-head
// A/D/dt_bias tied over head_dim and state_size). Per sequence b with state S = state[state_batch_indices[b], h]
// ([head_dim, state_size]) and head h reading group g = h / (num_heads / n_groups) of B and C:
//   dt' = softplus(dt[b, h] + dt_bias[h]) (or dt + dt_bias without dt_softplus), clamped to [dt_min, dt_max];
//   S <- exp(dt' A[h]) S + dt' x[b, h] B[b, g]^T;   out[b, h] = S C[b, g] + D[h] x[b, h].
// Math in fp32; the state is read and written in its own dtype.
#include <cmath>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class SelectiveStateUpdate : public Module {
 public:
  // dt_min/dt_max: vLLM's dt_limit ((0, inf) is no clamp; Mamba-2's 'time_step_limit').
  explicit SelectiveStateUpdate(bool dt_softplus = true, double dt_min = 0.0, double dt_max = INFINITY);

  // state: [num_slots, num_heads, head_dim, state_size] contiguous (f32, f16 or bf16); x: [batch, num_heads, head_dim]
  // (token stride free, head and channel strides packed: a view of the conv output); dt: [batch, num_heads] (token
  // stride free); A: [num_heads] f32; B, C: [batch, n_groups, state_size] (token stride free); D, dt_bias:
  // [num_heads] f32 or undefined (0); state_batch_indices: [batch] i32, distinct, in [0, num_slots)
  // -> new [batch, num_heads, head_dim] contiguous in x's dtype. Mutates state. On the GPU an index of -1
  // (kPadStateSlot) marks a padding row of a CUDA-graph batch: zero output, no state touched; the CPU path refuses it.
  Tensor forward(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                 const Tensor& C, const Tensor& D, const Tensor& dt_bias, const Tensor& state_batch_indices);

  bool dt_softplus() const { return dt_softplus_; }
  double dt_min() const { return dt_min_; }
  double dt_max() const { return dt_max_; }

 private:
  bool dt_softplus_;
  double dt_min_, dt_max_;
};

}  // namespace kbn::KBN_VARIANT
