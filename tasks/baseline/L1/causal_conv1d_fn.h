#pragma once
// Mamba-2's depthwise causal convolution over a step's prefill tokens (vLLM causal_conv1d_fn, varlen): each channel c of
// sequence s convolves its inputs, preceded by its width - 1 previous inputs (the conv state of its slot when
// has_initial_state[s], else zeros), with weight[c, :], adds bias[c] and applies silu when the op was built with it;
// the sequence's last width - 1 inputs (earlier state included when it is shorter) become its slot's conv state.
// Layouts are token-major: vLLM's x [dim, num_tokens] is x here transposed, and a conv state [width - 1, dim] keeps one
// row per earlier input, so every access is along contiguous channels.
#include <string>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class CausalConv1dFn : public Module {
 public:
  // activation: "silu" or "" (none), as vLLM's argument.
  explicit CausalConv1dFn(const std::string& activation = "silu");

  // x: [num_tokens, dim] (row stride may exceed dim, e.g. the xBC columns of the in_proj output; channels contiguous);
  // weight: [dim, width] contiguous; bias: [dim] or undefined; conv_states: [num_slots, width - 1, dim] contiguous,
  // x's dtype; has_initial_state, cache_indices: [num_seqs] i32; query_start_loc: [num_seqs + 1] i32 (starting at 0,
  // ending at num_tokens, each sequence at least one token) -> new [num_tokens, dim] contiguous.
  // Mutates conv_states (the slots of cache_indices, which must be distinct and in [0, num_slots)).
  Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& conv_states,
                 const Tensor& has_initial_state, const Tensor& cache_indices, const Tensor& query_start_loc);

  bool silu() const { return silu_; }

 private:
  bool silu_;
};

}  // namespace kbn::KBN_VARIANT
