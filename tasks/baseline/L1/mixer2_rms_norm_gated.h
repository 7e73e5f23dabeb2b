#pragma once
// Mamba-2's gated RMS norm (vLLM Mixer2RMSNormGated, norm_before_gate = false as Mamba-2 runs it): y = x * silu(gate)
// in fp32, then each group of group_size = hidden / n_groups channels is divided by its own rms and scaled by weight:
// out = y / sqrt(mean_group(y^2) + eps) * weight, rounded once to x's dtype.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Mixer2RMSNormGated : public Module {
 public:
  // hidden_size: this rank's gated channels; n_groups: this rank's groups (hidden_size a multiple of it).
  Mixer2RMSNormGated(int64_t hidden_size, int64_t n_groups, double eps = 1e-6, const ParamOptions& opts = {});

  // x: [num_tokens, hidden_size] (row stride free, channels contiguous); gate: [num_tokens, hidden_size] (row stride
  // free, e.g. the z columns of the in_proj output), x's dtype -> new [num_tokens, hidden_size] contiguous.
  Tensor forward(const Tensor& x, const Tensor& gate);

  int64_t hidden_size() const { return hidden_size_; }
  int64_t n_groups() const { return n_groups_; }
  int64_t group_size() const { return hidden_size_ / n_groups_; }
  double eps() const { return eps_; }

  Tensor weight;  // [hidden_size], ones when built

 private:
  int64_t hidden_size_, n_groups_;
  double eps_;
};

}  // namespace kbn::KBN_VARIANT
