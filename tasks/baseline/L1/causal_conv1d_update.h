#pragma once
// Mamba-2's causal convolution for one new input per sequence (vLLM causal_conv1d_update, decode): the window is the
// slot's conv state followed by the new input; out = act(bias + weight . window) per channel, and the state shifts by
// one (its oldest input dropped, the new one appended). State layout as CausalConv1dFn: [num_slots, width - 1, dim].
#include <string>

#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class CausalConv1dUpdate : public Module {
 public:
  explicit CausalConv1dUpdate(const std::string& activation = "silu");

  // x: [batch, dim] (row stride may exceed dim; channels contiguous); conv_states: [num_slots, width - 1, dim]
  // contiguous, x's dtype; weight: [dim, width] contiguous; bias: [dim] or undefined; conv_state_indices: [batch] i32,
  // distinct, in [0, num_slots) -> new [batch, dim] contiguous. Mutates conv_states. On the GPU an index of -1
  // (kPadStateSlot) marks a padding row of a CUDA-graph batch: zero output, no state touched; the CPU path refuses it.
  Tensor forward(const Tensor& x, const Tensor& conv_states, const Tensor& weight, const Tensor& bias,
                 const Tensor& conv_state_indices);

  bool silu() const { return silu_; }

 private:
  bool silu_;
};

}  // namespace kbn::KBN_VARIANT
