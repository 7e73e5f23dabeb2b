#pragma once
// MambaMixer2 (vLLM vllm/model_executor/layers/mamba/mamba_mixer2.py): the Mamba-2 mixer. in_proj gives, per token,
// [gate z (I) | xBC (conv_dim = I + 2 G N) | dt (num_heads)]; xBC goes through the causal conv (silu) and splits into
// x [num_heads, head_dim], B and C [G, N]; the SSD scan (prefill tokens) or the state update (decode tokens) gives y;
// y is gated by z and normalised per group (Mixer2RMSNormGated); out_proj maps it back to hidden_size.
// The layer's conv state [conv_kernel - 1, conv_dim] and SSM state [num_heads, head_dim, N] live in the engine's state
// cache (KVCache::states of this layer, rows AttentionMetadata::state_indices); the step's prefill sequences come first,
// as the metadata orders them. One GPU only (tensor parallel Mamba-2 is refused by the constructor).
#include <string>

#include "L1/causal_conv1d_fn.h"
#include "L1/causal_conv1d_update.h"
#include "L1/mamba_chunk_scan_combined.h"
#include "L1/mixer2_rms_norm_gated.h"
#include "L1/selective_state_update.h"
#include "L2/parallel_linear.h"
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MambaMixer2 : public Module {
 public:
  // dt_min/dt_max: the clamp of the time step (the config's time_step_limit).
  MambaMixer2(int64_t hidden_size, int64_t ssm_state_size, int64_t conv_kernel_size, int64_t intermediate_size,
              bool use_conv_bias, bool use_bias, int64_t n_groups, int64_t num_heads, int64_t head_dim,
              double rms_norm_eps, int64_t chunk_size, double dt_min, double dt_max, const std::string& prefix,
              const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] (normed) -> new [num_tokens, hidden_size]. Reads the forward context
  // (prefill/decode split, query_start_loc, state_indices, has_initial_state) and updates this layer's states.
  Tensor forward(const Tensor& hidden_states);

  // This layer's state cache: conv [conv_kernel - 1, conv_dim] and SSM [num_heads, head_dim, state_size], in `dtype`.
  LayerCacheSpec cache_spec(DType dtype) const;
  // A = -exp(A_log) in fp32 (vLLM stores A at load time); called once the weights are in.
  void process_weights_after_loading() override;

  int64_t layer_index() const { return layer_idx_; }
  int64_t conv_dim() const { return intermediate_size_ + 2 * n_groups_ * state_size_; }

  ColumnParallelLinear in_proj;  // [I + conv_dim + num_heads, hidden_size]
  Tensor conv_weight;            // "conv1d.weight": [conv_dim, conv_kernel] (the checkpoint's [conv_dim, 1, width])
  Tensor conv_bias;              // "conv1d.bias": [conv_dim] when use_conv_bias
  Tensor A_log;                  // [num_heads] f32
  Tensor D;                      // [num_heads] f32
  Tensor dt_bias;                // [num_heads] f32
  Tensor A;                      // [num_heads] f32, -exp(A_log): not a parameter
  Mixer2RMSNormGated norm;
  RowParallelLinear out_proj;

 private:
  int64_t hidden_size_, state_size_, conv_kernel_, intermediate_size_, n_groups_, num_heads_, head_dim_;
  int64_t layer_idx_;
  std::string prefix_;
  CausalConv1dFn conv_fn_;
  CausalConv1dUpdate conv_update_;
  MambaChunkScanCombined scan_;
  SelectiveStateUpdate state_update_;
};

}  // namespace kbn::KBN_VARIANT
