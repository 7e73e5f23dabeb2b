#pragma once
// Mamba-2's SSD scan over a step's prefill tokens (vLLM mamba_chunk_scan_combined, varlen, with the states read from
// and written to the state cache's slots directly instead of vLLM's gathered initial_states / returned varlen_states).
// Per sequence s (query_start_loc) and head h (group g = h / (num_heads / n_groups) of B and C), the state S
// ([head_dim, state_size]) starts at state[state_indices[s], h] when has_initial_state[s], else at zero; per token t:
//   dt' = softplus(dt[t, h] + dt_bias[h]) (or without softplus), clamped to [dt_min, dt_max];
//   S <- exp(dt' A[h]) S + dt' x[t, h] B[t, g]^T;   out[t, h] = S C[t, g] + D[h] x[t, h];
// and state[state_indices[s], h] <- S after the sequence's last token. The kernels evaluate it chunk by chunk
// (chunk_size tokens: intra-chunk quadratic form, chunk states, state passing), which changes only the rounding;
// tasks/reference/mamba.cpp has both the recurrence (the oracle) and the chunked form.
#include <cmath>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MambaChunkScanCombined : public Module {
 public:
  // chunk_size: a power of two (the config's 'chunk_size'); dt_min/dt_max: vLLM's dt_limit.
  MambaChunkScanCombined(int64_t chunk_size, bool dt_softplus = true, double dt_min = 0.0, double dt_max = INFINITY);

  // x: [num_tokens, num_heads, head_dim] (token stride free, heads and channels packed); dt: [num_tokens, num_heads]
  // (token stride free); A: [num_heads] f32; B, C: [num_tokens, n_groups, state_size] (token stride free); D,
  // dt_bias: [num_heads] f32 or undefined (0); state: [num_slots, num_heads, head_dim, state_size] contiguous (f32,
  // f16 or bf16); has_initial_state, state_indices: [num_seqs] i32 (indices distinct, in [0, num_slots));
  // query_start_loc: [num_seqs + 1] i32 (from 0 to num_tokens, every sequence at least one token)
  // -> new [num_tokens, num_heads, head_dim] contiguous in x's dtype. Mutates state.
  Tensor forward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& D,
                 const Tensor& dt_bias, const Tensor& state, const Tensor& has_initial_state,
                 const Tensor& state_indices, const Tensor& query_start_loc);

  int64_t chunk_size() const { return chunk_size_; }
  bool dt_softplus() const { return dt_softplus_; }
  double dt_min() const { return dt_min_; }
  double dt_max() const { return dt_max_; }

 private:
  int64_t chunk_size_;
  bool dt_softplus_;
  double dt_min_, dt_max_;
};

}  // namespace kbn::KBN_VARIANT
