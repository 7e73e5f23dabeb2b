#pragma once
// Runs one scheduled step on the model: builds input_ids, positions and the attention metadata from a
// SchedulerOutput, runs CausalLM::forward under a ForwardContextGuard, computes logits only for the last
// token of each sequence that samples this step, and samples them. Owns the paged KV caches, and in graph
// mode the stream every step runs on and the CUDA graphs that serve decode-only steps.
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda_graph_runner.h"
#include "engine/nano_batch.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/step_profile.h"
#include "kbn/causal_lm.h"

namespace kbn::engine {

// eager: every step launches its kernels one by one. graph: decode-only steps of up to the largest captured
// batch replay a CUDA graph (the C++ counterpart of vLLM's compiled mode); other steps run eagerly.
enum class ExecutionMode { eager, graph };
const char* execution_mode_name(ExecutionMode mode);
// "eager" or "graph"; the error names what was expected.
ExecutionMode parse_execution_mode(const std::string& s);

// The tensors of one step, on the runner's device, and the hidden-state rows whose logits are needed.
struct StepInputs {
  Tensor input_ids;  // [num_tokens] i64: prefill chunks sequence by sequence, then one token per decode
  Tensor positions;  // [num_tokens] i64
  AttentionMetadata metadata;
  std::vector<int64_t> logit_rows;  // row of each sampling sequence's last token, in SchedulerOutput order
};

// How the automatic KV cache size was reached (for the CLI and the results' provenance).
struct KVCacheSizing {
  int64_t num_blocks = 0;
  int64_t bytes_per_block = 0;  // K and V of every layer
  int64_t num_state_slots = 0;  // recurrent-state models: sequences whose states fit (0 for others)
  std::string explanation;
};

class ModelRunner {
 public:
  // Graph mode needs a CUDA device; the runner then creates a non-blocking stream of its own and runs all its
  // device work on it (sizing, KV allocation, capture, every step), after waiting for the device to drain the
  // work queued on other streams (the weights).
  // kv_cache_dtype: the paged K/V layers' page dtype (kbn::parse_kv_cache_dtype; nullopt: the model's).
  ModelRunner(CausalLM& model, Variant variant, Device device, int64_t block_size,
              ExecutionMode mode = ExecutionMode::eager, std::optional<DType> kv_cache_dtype = std::nullopt);

  Device device() const { return device_; }
  ExecutionMode mode() const { return mode_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_kv_blocks() const { return num_kv_blocks_; }
  // Bytes of one block: a page of every pool tensor (kbn::KVCacheGroups; every paged layer's K and V, or latent,
  // when all layers see one window).
  int64_t kv_bytes_per_block() const;
  // Paged bytes of one token over all layers: what a block of block_size tokens would cost if every layer kept its
  // own page (no KV cache groups sharing pool tensors).
  int64_t kv_bytes_per_token() const;
  // What each layer keeps, as allocated: the model's cache_specs() (read anew: a model may change them before the
  // cache is allocated) with the paged K/V in the kv_cache_dtype.
  std::vector<LayerCacheSpec> cache_specs() const;
  // The sliding window of each KV cache group (0: full attention), the engine's BlockManager's groups.
  std::vector<int64_t> kv_group_windows() const;
  // Recurrent-state bytes of one sequence over all layers (0 for a model without such layers).
  int64_t state_bytes_per_sequence() const;

  // Number of blocks when the user gave none. CUDA: gpu_memory_utilization x total device memory, minus what
  // is in use now (weights, the CUDA context, other processes), minus the memory a profile run of the largest
  // step (max_num_batched_tokens tokens in min(max_num_seqs, tokens) sequences) makes the allocator hold.
  // CPU: enough for max_num_seqs sequences of max_model_len tokens, capped at 1 GiB of cache (at least one
  // max_model_len sequence). A sequence's blocks are engine::max_blocks_held's: with sliding-window groups, a long
  // sequence holds only the windows' blocks in those groups. A model with no paged layers gets max_num_seqs x
  // max_model_len blocks of nothing (the block tables still count tokens). Recurrent-state models: the states of
  // num_state_slots sequences come out of the budget first; 0 = as many as fit, at most max_num_seqs (one state per
  // running sequence; 1 GiB of states on CPU). On CUDA a state costs far more than a step's activations
  // (Mamba-Codestral-7B: 132 MB per sequence), so the profile run takes at most the sequences whose states fit in 3/4
  // of the budget, and the slots never exceed what it exercised.
  KVCacheSizing auto_num_kv_blocks(int64_t max_num_batched_tokens, int64_t max_num_seqs, int64_t max_model_len,
                                   double gpu_memory_utilization, int64_t num_state_slots = 0);
  // Allocates the paged caches and, for recurrent-state layers, num_state_slots states each
  // (engine::allocate_kv_caches); once.
  void allocate_kv_cache(int64_t num_blocks, int64_t num_state_slots = 0);

  // Graph mode, after allocate_kv_cache(): captures a decode graph per batch size (ascending, e.g.
  // cuda_graph_capture_sizes()); sequences up to max_model_len tokens; once.
  void capture_cuda_graphs(const std::vector<int64_t>& sizes, int64_t max_model_len);
  // The captured graphs; null in eager mode and before capture.
  const CudaGraphRunner* cuda_graphs() const { return graphs_.get(); }

  StepInputs prepare_inputs(const SchedulerOutput& out) const;
  // Runs `out`; returns one token per entry with samples = true, in out.seqs order. launch() then collect().
  std::vector<int64_t> execute(const SchedulerOutput& out);
  // Async scheduling (LLMEngine): launch() enqueues the step's forward, logits and sampling and returns; when every
  // sampling row is greedy, the argmax ids stay on the device (a copy to pinned host memory is queued), so the host
  // can schedule and launch the next step while this one runs. collect() waits for the oldest launched step's ids
  // and returns them as execute() does. At most two steps are launched and not collected. A token the scheduler
  // counts but whose id is not on the host (Sequence::num_pending) must have been sampled by the last launched step:
  // its input id is copied on the device from that step's ids. Steps with a non-greedy row sample on the host
  // (Sampler), so their launch() waits for the device.
  void launch(const SchedulerOutput& out);
  std::vector<int64_t> collect();
  int64_t num_launched() const { return int64_t(launched_.size()); }  // launched, not collected
  // Steps execute() served by a graph replay so far.
  int64_t num_graph_steps() const { return num_graph_steps_; }
  // Step timing (off by default): when on, every execute() records where its time went in last_step_times(),
  // device spans by CUDA events on this runner's stream. A step in which no sequence samples then waits for
  // the device before returning (otherwise the host would schedule the next step while the device works).
  void set_profiling(bool on) { profiling_ = on; }
  // --check-finite (off by default): the logits of every step that samples are checked for NaN/Inf, and a failure
  // names the first layer whose output was not finite (engine/finite_check.h).
  void set_check_finite(bool on) { check_finite_ = on; }
  const StepTimes& last_step_times() const { return last_step_times_; }
  // Overlapped nano-batches (engine/nano_batch.h; count 1, the default: off). Steps that run eagerly (every step in
  // eager mode; in graph mode those no graph serves) and reach nb's thresholds are split; on CUDA each nano-batch
  // runs the whole model on a stream of its own, forked from and joined into the runner's stream, and the sampled
  // rows are gathered in step order before the logits. On the CPU they run one after another (the same tokens as
  // one batch: what the CPU tests check). Set it before the KV cache is sized, so the profile step splits too.
  void set_nano_batching(const NanoBatching& nb);
  // Steps run as overlapped nano-batches so far.
  int64_t num_nano_batched_steps() const { return num_nano_steps_; }
  // Nano-batches that started after the previous one reached its first layer's attention (NanoBatching::stagger).
  int64_t num_staggered_starts() const { return num_staggered_starts_; }

  // Forward + logits + sampling of a dummy all-prefill step (num_tokens tokens in num_seqs sequences) on
  // temporary caches: the largest step the scheduler can produce. Used for sizing; callable on CPU too. Returns
  // the bytes of its temporary recurrent states (one per sequence), which the sizing does not count as
  // activations.
  int64_t profile_run(int64_t num_tokens, int64_t num_seqs);

 private:
  // The stream the runner's device work goes to: its own in graph mode, else the caller's current stream.
  Stream stream() const { return stream_ ? stream_->get() : current_stream(); }
  // A step's sampled ids: `ids` ([n] i64 on the runner's device) when every row was greedy, else `host`.
  struct Sampled {
    std::vector<int64_t> host;
    Tensor ids;
  };
  Sampled run(const SchedulerOutput& out, std::vector<KVCache>& caches);
  // run() of a step split into nano-batches (more than one).
  Sampled run_nano_batches(const SchedulerOutput& out, const std::vector<NanoBatch>& parts,
                           std::vector<KVCache>& caches);
  // The step's tensors, uploaded on stream s.
  StepInputs prepare_inputs(const SchedulerOutput& out, Stream s) const;
  // The input rows of `out` (prefill chunks sequence by sequence, then decodes) whose token is pending, each with
  // its row in last_ids_: (input row, source row). Throws when a pending token was not sampled by the last launch.
  std::vector<std::pair<int32_t, int32_t>> pending_inputs(const SchedulerOutput& out) const;
  // Logits of hidden rows `rows` (the sampling sequences' last tokens, in out.seqs order), then sampling. `caches`
  // and `md` (null: rebuilt from `out`) serve --check-finite's search for the layer behind non-finite logits.
  Sampled sample(const SchedulerOutput& out, const Tensor& hidden, const std::vector<int64_t>& rows,
                 const std::vector<KVCache>& caches, const AttentionMetadata* md);
  // The same from the gathered rows `last` ([sampling sequences, hidden]); `hidden` is what --check-finite's search
  // tests last (the step's final hidden states, or `last` itself).
  Sampled sample_rows(const SchedulerOutput& out, const Tensor& last, const Tensor& hidden,
                      const std::vector<KVCache>& caches, const AttentionMetadata* md);
  // Step timing marks: 0 before the forward, 1 after it, 2 after the logits. On CUDA an event recorded on the
  // runner's stream; on CPU the host clock (the work is synchronous there).
  void mark(int i);
  // Seconds between marks a and b; on CUDA after the stream has passed b.
  double between(int a, int b) const;

  CausalLM& model_;
  Device device_;
  int64_t block_size_;
  std::optional<DType> kv_cache_dtype_;
  ExecutionMode mode_;
  Sampler sampler_;
  // Declared before the device tensors and the graphs, so it is destroyed after them; its destructor waits for
  // the work that used them.
  std::unique_ptr<OwnedStream> stream_;
  int64_t num_kv_blocks_ = 0;
  std::vector<KVCache> kv_caches_;
  std::unique_ptr<CudaGraphRunner> graphs_;  // destroyed before the caches whose addresses it holds
  int64_t num_graph_steps_ = 0;
  bool profiling_ = false;
  bool check_finite_ = false;
  int64_t steps_sampled_ = 0;  // steps that computed logits (for --check-finite's messages)
  StepTimes last_step_times_;
  double host_marks_[3] = {0, 0, 0};
  struct StepEvents;                     // three CUDA events, created on first use (CUDA devices only)
  std::shared_ptr<StepEvents> events_;  // shared_ptr: the deleter is defined in the .cpp with the CUDA types
  NanoBatching nano_;
  int64_t num_nano_steps_ = 0;
  int64_t num_staggered_starts_ = 0;
  struct NanoStreams;                       // a stream and an event per nano-batch, a fork event (CUDA devices)
  std::shared_ptr<NanoStreams> nano_streams_;
  // Launched steps not yet collected, oldest first: their ids on the host, or on their way to host buffer `slot`.
  struct Launched {
    std::vector<int64_t> tokens;
    int64_t count = 0;  // ids on their way (slot >= 0)
    int slot = -1;
  };
  std::deque<Launched> launched_;
  // The last launched step's device ids, and the sequences that sampled in it, row by row (pending tokens' source).
  Tensor last_ids_;
  std::vector<const Sequence*> last_samplers_;
  struct HostIds;  // two pinned buffers and their events (CUDA devices), used in turn by launched steps
  std::shared_ptr<HostIds> host_ids_;
};

}  // namespace kbn::engine
