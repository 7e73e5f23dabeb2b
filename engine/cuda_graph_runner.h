#pragma once
// CUDA graphs for decode batches (vLLM's CUDAGraphRunner): at engine start-up, CausalLM::forward over a
// pure-decode batch is captured once per batch size of a fixed list, largest first, reading its inputs from
// static device buffers. A decode-only step of n sequences then copies its inputs into those buffers, pads
// the rows up to the smallest captured size >= n, and replays that size's graph: one launch instead of one
// per kernel, which is what decode at small batches is bound by. Logits and sampling stay outside the graph
// (computed for the n real rows only, exactly as in eager mode).
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "kbn/causal_lm.h"

// Opaque CUDA handles (cudaGraphExec_t, cudaEvent_t), so this header needs no CUDA include.
struct CUgraphExec_st;
struct CUevent_st;

namespace kbn::engine {

// Batch sizes to capture, ascending: 1, 2, 4, then every multiple of 8, up to
// cap = min(max_num_seqs, max_num_batched_tokens, 512) (vLLM's list), plus cap itself when it is not in the
// list, so that every decode batch the scheduler can form (at most max_num_seqs sequences, one token each
// within the budget) has a graph.
std::vector<int64_t> cuda_graph_capture_sizes(int64_t max_num_seqs, int64_t max_num_batched_tokens);

class CudaGraphRunner {
 public:
  // Captures one graph per entry of `sizes` on `stream`, which must be the stream the engine runs every step
  // on (see the .cpp for why). `kv_caches` must stay allocated and in place for the runner's lifetime: the
  // graphs hold their addresses. max_model_len bounds the sequences a replay may serve (the decode attention
  // chooses its key partitioning for it at capture). Throws naming the batch size when a capture fails.
  CudaGraphRunner(CausalLM& model, std::vector<KVCache>& kv_caches, Device device, Stream stream,
                  const std::vector<int64_t>& sizes, int64_t max_model_len, int64_t block_size);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  const std::vector<int64_t>& sizes() const { return sizes_; }  // ascending
  double capture_seconds() const { return capture_seconds_; }
  // Growth of the caching allocator's reserved memory while capturing (static buffers, graph outputs, and
  // activation blocks the allocator keeps for later steps too).
  int64_t capture_bytes() const { return capture_bytes_; }

  // True when `out` is a decode-only step that a captured graph can serve: no prefill, at most the largest
  // captured size, every sequence within max_model_len.
  bool can_run(const SchedulerOutput& out) const;
  // Replays the graph for `out` (can_run(out) must hold) on the runner's stream and returns the hidden
  // states of its sequences, [out.seqs.size(), hidden_size], in out.seqs order: a view of the graph's output
  // buffer, valid until the next replay. pending: (sequence index, row of pending_ids) for each sequence whose token
  // is pending (async scheduling): its input id is copied on the device from pending_ids ([m] i64).
  Tensor run(const SchedulerOutput& out, const std::vector<std::pair<int32_t, int32_t>>& pending = {},
             const Tensor& pending_ids = Tensor());

 private:
  struct Graph {
    int64_t size = 0;
    CUgraphExec_st* exec = nullptr;
    Tensor output;  // [size, hidden_size]: written by every replay, held so no other tensor gets its memory
  };

  // Warm-up, then capture of one batch size into graphs_.
  void capture(CausalLM& model, std::vector<KVCache>& kv_caches, int64_t size);
  AttentionMetadata decode_metadata(int64_t size) const;
  // Destroys the graphs, the event and the pinned buffer (after the stream has drained).
  void release();

  Device device_;
  Stream stream_;
  int64_t max_model_len_;
  int64_t block_size_;
  int64_t max_batch_;
  int64_t max_blocks_per_seq_;
  int64_t num_kv_groups_ = 1;  // KV cache groups (kbn::KVCacheGroups): a slot mapping and block tables each
  std::vector<int64_t> sizes_;
  double capture_seconds_ = 0;
  int64_t capture_bytes_ = 0;

  // Static inputs, sized for the largest captured batch; every graph reads rows [0, its size).
  // [2 + groups, max_batch] i64: input_ids, positions, then each KV cache group's slot_mapping (-1 = padding, not
  // stored)
  Tensor token_rows_;
  Tensor seq_lens_;            // [max_batch] i32 (0 = padding)
  Tensor block_tables_;        // [groups, max_batch, max_blocks_per_seq] i32
  Tensor query_start_loc_;     // [1] i32 = {0}: no prefill
  // Recurrent-state models (some layer holds states): [2, max_batch] i32, the state slots (-1 = padding: the state
  // ops skip the row) and has_initial_state (1: a decoding sequence continues its state). Undefined otherwise.
  Tensor state_rows_;
  bool stateful_ = false;
  std::vector<Graph> graphs_;  // ascending size

  // Pinned host mirrors of the static inputs (one allocation), so the copies are truly asynchronous.
  void* host_ = nullptr;
  int64_t* host_rows_ = nullptr;          // [2 + groups, max_batch]
  int32_t* host_seq_lens_ = nullptr;      // [max_batch]
  int32_t* host_block_tables_ = nullptr;  // [groups, max_batch, max_blocks_per_seq]
  int32_t* host_state_rows_ = nullptr;    // [2, max_batch] (stateful models)
  CUevent_st* inputs_copied_ = nullptr;   // recorded after the last step's copies out of host_
};

}  // namespace kbn::engine
