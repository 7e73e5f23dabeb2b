#pragma once
// Per-step attention metadata, set by whoever runs the model (the engine's model runner, a test, the kernel
// bench) and read by attention layers, as in vLLM's set_forward_context / get_forward_context.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kbn/tensor.h"

namespace kbn {

// Paged KV cache of one attention layer. Layout (vLLM flash layout, one tensor per K and V):
//   [num_blocks, block_size, num_kv_heads, head_size]; token slot s lives at block s / block_size, row s % block_size.
struct KVCache {
  Tensor key;    // paged K/V layers
  Tensor value;
  Tensor latent;  // paged latent layers (MLA): [num_blocks, block_size, latent_size], one row per token
  // Recurrent-state layers (LayerCacheSpec::Kind::state): one tensor per entry of the layer's state_shapes,
  // [num_state_slots, ...shape]; a sequence's state is row AttentionMetadata::state_indices[i] of each.
  std::vector<Tensor> states;
  // The KV cache group whose block table and slot mapping its pages follow (kbn::KVCacheGroups; 0 in a model whose
  // paged layers all see one window). Layers of different groups may share the same pool tensors.
  int32_t kv_group = 0;
  // The layer's sliding window (0: none): its group's table entries before the window of a sequence's next token
  // may be blocks it gave back (written as block 0), which nothing of this layer reads.
  int64_t sliding_window = 0;
};

// Tokens of a step are ordered: all prefill (or chunked-prefill) tokens first, sequence by sequence, then
// one token per decoding sequence. Sequences are numbered the same way (prefills, then decodes).
// A state_indices entry of a padding row (decode batches padded up to a captured CUDA-graph size): the state ops
// (causal_conv1d_update, selective_state_update) read and write no state for it and give it a zero output.
constexpr int32_t kPadStateSlot = -1;

struct AttentionMetadata {
  int64_t num_prefills = 0;  // sequences with query length >= 1 processed as prefill
  int64_t num_prefill_tokens = 0;
  int64_t num_decodes = 0;  // sequences (= tokens) in decode
  Tensor slot_mapping;      // [num_tokens] i64; -1 = do not store (padding)
  Tensor query_start_loc;   // [num_prefills + 1] i32: prefix sums of prefill query lengths
  Tensor seq_lens;          // [num_prefills + num_decodes] i32: cached + new tokens per sequence
  Tensor block_tables;      // [num_prefills + num_decodes, max_blocks_per_seq] i32
  int64_t max_prefill_query_len = 0;
  int64_t max_prefill_seq_len = 0;
  int64_t max_decode_seq_len = 0;
  // Recurrent-state layers (defined when the step's sequences hold state slots): sequence i's state slot, and
  // whether that slot holds its state already (0 when the sequence's first token is in this step: the slot then
  // holds a previous owner's state and the layer starts from zero instead). [num_prefills + num_decodes] i32 each.
  Tensor state_indices;
  Tensor has_initial_state;
  // KV cache groups 1.. (models whose layers see different sliding windows, kbn::KVCacheGroups): each group's slot
  // mapping and block tables, shaped as slot_mapping and block_tables (which are group 0's).
  std::vector<Tensor> more_slot_mappings, more_block_tables;

  int64_t num_tokens() const { return num_prefill_tokens + num_decodes; }
  int64_t num_kv_groups() const { return 1 + int64_t(more_block_tables.size()); }
  // Group `g`'s slot mapping and block tables; the error names the group and how many the step has.
  const Tensor& slot_mapping_of(int64_t g) const;
  const Tensor& block_tables_of(int64_t g) const;
};

struct ForwardContext {
  const AttentionMetadata* attn_metadata = nullptr;
  std::vector<KVCache>* kv_caches = nullptr;  // indexed by layer
  // Called by each layer that reads its cache (attention, latent attention, Mamba-2's mixer) with its layer index,
  // before it launches that work: where whoever runs the model marks progress through the layers (the engine's
  // staggered nano-batches record an event on the stream there). nullptr: nothing.
  const std::function<void(int64_t layer)>* layer_hook = nullptr;

  void entering_layer_cache(int64_t layer) const {
    if (layer_hook && *layer_hook) (*layer_hook)(layer);
  }
};

// Throws when no context is set (an attention layer called outside a model step).
const ForwardContext& get_forward_context();
bool has_forward_context();

// RAII: installs a context for the calling thread and restores the previous one.
class ForwardContextGuard {
 public:
  explicit ForwardContextGuard(const ForwardContext& ctx);
  ~ForwardContextGuard();
  ForwardContextGuard(const ForwardContextGuard&) = delete;
  ForwardContextGuard& operator=(const ForwardContextGuard&) = delete;

 private:
  ForwardContext prev_;
  bool had_prev_;
};

// "model.layers.12.self_attn.attn" -> 12 (vLLM's extract_layer_index); the error names the prefix.
int64_t extract_layer_index(const std::string& prefix);

}  // namespace kbn
