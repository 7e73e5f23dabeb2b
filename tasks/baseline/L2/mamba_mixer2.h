#pragma once
// MambaMixer2 (vLLM vllm/model_executor/layers/mamba/mamba_mixer2.py): the Mamba-2 mixer. in_proj gives, per token,
// [gate z (I) | xBC (conv_dim = I + 2 G N) | dt (num_heads)]; xBC goes through the causal conv (silu) and splits into
// x [num_heads, head_dim], B and C [G, N]; the SSD scan (prefill tokens) or the state update (decode tokens) gives y;
// y is gated by z and normalised per group (Mixer2RMSNormGated); out_proj maps it back to hidden_size.
// The layer's conv state [conv_kernel - 1, conv_dim] and SSM state [num_heads, head_dim, N] live in the engine's state
// cache (KVCache::states of this layer, rows AttentionMetadata::state_indices); the step's prefill sequences come
// first, as the metadata orders them.
//
// Tensor parallel (vLLM's sharding, kbn::parallel_state()): each rank holds num_heads / tp whole heads, i.e. its rows
// of every per-head segment (z, x and dt of in_proj, x of conv1d, A_log, D, dt_bias) and its columns of out_proj (a
// RowParallelLinear, all-reduced). The groups of B and C go with their heads: when tp divides n_groups, each rank
// holds n_groups / tp groups (in_proj's and conv1d's B and C rows), exactly the groups its heads read, and the gated
// norm's groups (I / n_groups channels) are all on one rank, so it normalises them locally with its slice of
// norm.weight. With one group (n_groups == 1) every rank holds all of B and C (they are small: N rows each), and the
// gated norm's single group spans every rank's channels: the ranks all-gather the norm's inputs and each normalises
// the full row with the whole norm.weight and keeps its slice (see gated_norm). Other n_groups are refused (vLLM's
// rule too). The checkpoint's fused tensors (in_proj [z | x | B | C | dt], conv1d [x | B | C]) are cut segment by
// segment by mamba_v2_sharded_weight_loader. The state cache is this rank's: conv [conv_kernel - 1, conv_dim()] and
// SSM [num_heads / tp, head_dim, N].
#include <string>
#include <vector>

#include "L1/causal_conv1d_fn.h"
#include "L1/causal_conv1d_update.h"
#include "L1/mamba_chunk_scan_combined.h"
#include "L1/mixer2_rms_norm_gated.h"
#include "L1/selective_state_update.h"
#include "L2/parallel_linear.h"
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

// One segment of a fused checkpoint tensor, along its first dimension (vLLM's shard_spec entries).
struct MambaShardSegment {
  std::string name;  // "z", "x", "B", "C", "dt": named by the loader's errors
  int64_t rows;      // the checkpoint's rows (every rank's)
  bool replicated;   // every rank holds all rows (B and C with one group), else rows / tp each, in rank order
};

// vLLM's mamba_v2_sharded_weight_loader: loads this rank's rows of each segment of a fused checkpoint tensor
// [sum of segment rows, ...] into consecutive rows of the parameter (trailing dimensions equal). `what` names the
// parameter in errors.
WeightLoader mamba_v2_sharded_weight_loader(std::string what, std::vector<MambaShardSegment> segments, int tp_size,
                                            int tp_rank);

// How one rank of a tensor-parallel group holds the mixer (see the top of this file), from the whole model's sizes;
// throws naming the argument (num_heads, n_groups) and the tensor-parallel size when they do not split.
struct Mamba2Shard {
  int tp_size = 1, tp_rank = 0;
  int64_t num_heads = 0;           // this rank's
  int64_t n_groups = 0;            // this rank's groups of B and C
  int64_t intermediate_size = 0;   // this rank's gated channels: num_heads * head_dim
  bool replicated_groups = false;  // n_groups == 1 with tp > 1: every rank holds the group

  static Mamba2Shard of(int64_t num_heads, int64_t n_groups, int64_t head_dim, int64_t intermediate_size,
                        const std::string& prefix);
};

// in_proj: a column-parallel linear whose one checkpoint tensor [z | x | B | C | dt] is sharded segment by segment
// (vLLM keeps a ColumnParallelLinear and swaps its weight loader, as this does).
class MambaInProj : public ColumnParallelLinear {
 public:
  MambaInProj(int64_t hidden_size, const std::vector<MambaShardSegment>& segments, bool bias, const ParamOptions& opts,
              const std::string& prefix);
};

class MambaMixer2 : public Module {
  // First, so that the parameters below are built from it (members are initialised in declaration order).
  Mamba2Shard shard_;

 public:
  // dt_min/dt_max: the clamp of the time step (the config's time_step_limit). The sizes are the whole model's; each
  // rank of a tensor-parallel group builds its shard.
  MambaMixer2(int64_t hidden_size, int64_t ssm_state_size, int64_t conv_kernel_size, int64_t intermediate_size,
              bool use_conv_bias, bool use_bias, int64_t n_groups, int64_t num_heads, int64_t head_dim,
              double rms_norm_eps, int64_t chunk_size, double dt_min, double dt_max, const std::string& prefix,
              const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] (normed) -> new [num_tokens, hidden_size]. Reads the forward context
  // (prefill/decode split, query_start_loc, state_indices, has_initial_state) and updates this layer's states.
  Tensor forward(const Tensor& hidden_states);
  // The same from in_proj's output proj [num_tokens, I / tp + conv_dim() + num_heads / tp] (a caller that computed it
  // itself: the decoder layer's one-token norm + in_proj).
  Tensor forward_proj(const Tensor& proj);

  // This rank's state cache: conv [conv_kernel - 1, conv_dim()] and SSM [num_heads / tp, head_dim, state_size], in
  // `dtype`.
  LayerCacheSpec cache_spec(DType dtype) const;
  // A = -exp(A_log) in fp32 (vLLM stores A at load time); called once the weights are in.
  void process_weights_after_loading() override;

  int64_t layer_index() const { return layer_idx_; }
  // This rank's conv channels: its x channels and its (or, with one group, all) B and C channels.
  int64_t conv_dim() const { return shard_.intermediate_size + 2 * shard_.n_groups * state_size_; }
  const Mamba2Shard& shard() const { return shard_; }

  // Shapes per rank (tp 1: the checkpoint's, conv1d.weight viewed as [conv_dim, conv_kernel]).
  MambaInProj in_proj;  // [I / tp + conv_dim() + num_heads / tp, hidden_size]
  Tensor conv_weight;   // "conv1d.weight": [conv_dim(), conv_kernel] (the checkpoint's [conv_dim, 1, width])
  Tensor conv_bias;     // "conv1d.bias": [conv_dim()] when use_conv_bias
  Tensor A_log;         // [num_heads / tp] f32
  Tensor D;             // [num_heads / tp] f32
  Tensor dt_bias;       // [num_heads / tp] f32
  Tensor A;             // [num_heads / tp] f32, -exp(A_log): not a parameter
  // "norm.weight" is [I / tp], this rank's groups; with replicated groups [I], the whole row gated_norm normalises.
  Mixer2RMSNormGated norm;
  RowParallelLinear out_proj;

 private:
  // y (this rank's [T, I / tp] scan output) gated by `gate` and normalised per group -> [T, I / tp] (row stride free).
  Tensor gated_norm(const Tensor& y, const Tensor& gate);

  int64_t hidden_size_, state_size_, conv_kernel_, num_heads_, head_dim_;  // num_heads_: this rank's
  int64_t layer_idx_;
  std::string prefix_;
  CausalConv1dFn conv_fn_;
  CausalConv1dUpdate conv_update_;
  MambaChunkScanCombined scan_;
  SelectiveStateUpdate state_update_;
};

}  // namespace kbn::KBN_VARIANT
