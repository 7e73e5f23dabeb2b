#pragma once
// The continuous-batching engine (nano-vllm's LLMEngine with vLLM V1's scheduling): requests go into the
// scheduler; each step() schedules one token budget of decodes and (chunked) prefills, runs the model once
// over all of them, samples, and returns the requests that finished. The model is seen only through the
// registry's L4 interface (kbn::CausalLM).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/block_manager.h"
#include "engine/metrics.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/serial_floor.h"
#include "engine/step_profile.h"
#include "engine/tp_group.h"

namespace kbn::engine {

struct EngineConfig {
  int64_t block_size = 16;                // token slots per KV block
  int64_t num_kv_blocks = 0;              // 0 = sized automatically (ModelRunner::auto_num_kv_blocks)
  int64_t max_num_batched_tokens = 8192;  // token budget of one step
  int64_t max_num_seqs = 256;             // sequences running at once
  int64_t max_model_len = 0;              // prompt + output tokens per sequence; required (e.g. the config's
                                          // max_position_embeddings)
  double gpu_memory_utilization = 0.9;    // share of the GPU's memory the engine may fill (auto sizing on CUDA)
  // graph (CUDA only): decode-only steps replay CUDA graphs captured at construction for the batch sizes of
  // cuda_graph_capture_sizes(max_num_seqs, max_num_batched_tokens), after the KV cache is allocated.
  ExecutionMode mode = ExecutionMode::eager;
  // Automatic prefix caching (BlockManager), on by default as in vLLM V1: requests that share leading tokens,
  // and a preempted request coming back, take cached KV blocks instead of recomputing them.
  bool enable_prefix_caching = true;
  // SchedulerConfig::reserve_max_tokens: admit a request only when every running request can still reach its
  // max_tokens without preemption (off: vLLM's optimistic admission).
  bool reserve_max_tokens = false;
  // Record where each step's time goes (step_profile()): host spans and, on CUDA, device spans by events. A step
  // that samples nothing then waits for the device before the next one is scheduled.
  bool profile_steps = false;
  // Every sampling step's logits checked for NaN/Inf on every rank; a failure names the first layer whose output
  // was not finite (engine/finite_check.h). One device-to-host copy of the logits per step.
  bool check_finite = false;
  // Models with recurrent-state layers (Mamba, gated delta net): state slots, one per running sequence (0 = as
  // many as fit in memory, at most max_num_seqs; max_num_seqs when num_kv_blocks is given). Prefix caching is
  // turned off for them (a cached prefix has no state to resume from).
  int64_t num_state_slots = 0;
  // vLLM's kv_cache_dtype (kbn::parse_kv_cache_dtype): "auto" keeps the model's dtype; "fp8" / "fp8_e4m3" stores
  // the paged K/V in fp8 e4m3 (half a 16-bit page) with each attention layer's per-tensor k_scale / v_scale (from
  // the checkpoint, else 1.0).
  std::string kv_cache_dtype = "auto";
  // Overlapped nano-batches (engine/nano_batch.h; count 1, the default: off): a step run eagerly runs as
  // min(count, its sequences) nano-batches when that gives each min_tokens tokens or more, each the whole model on a
  // CUDA stream of its own, so one's decode attention can run under another's GEMMs. Steps a CUDA graph serves are not
  // split. One GPU only: with tensor parallelism the nano-batches' all-reduces would run concurrently on each rank's
  // one communicator and peer-memory staging buffer, so the engine refuses the combination.
  NanoBatching nano_batching;
  // Async scheduling (vLLM's --async-scheduling): a step whose sampling rows are all greedy is launched, and the
  // engine schedules and launches the next step before the sampled ids reach the host; the next step takes them
  // on the device (ModelRunner::launch). The host's scheduling, input preparation and launches then run while the
  // device computes, instead of between steps. The tokens are the same as without it. A sequence that ends by EOS
  // has already been scheduled for one more token, which is computed and discarded; length limits are known in
  // advance and waste nothing. Steps with a non-greedy row sample on the host and run synchronously. One GPU only,
  // and not with profile_steps (which times each step alone).
  bool async_scheduling = false;
};

struct EngineProgress {
  int64_t finished = 0;
  int64_t total = 0;
  int64_t output_tokens = 0;  // generated so far, finished requests or not
  int64_t steps = 0;
  double elapsed_s = 0;
};

// The KV cache in use at the step after which the engine held the most blocks (one rank's cache with tensor
// parallelism): what sliding-window KV cache groups save shows as bytes against full_bytes.
struct KvPeak {
  int64_t blocks = 0;      // blocks held by running sequences (cached blocks no sequence holds are free)
  int64_t bytes = 0;       // blocks x bytes per block
  int64_t sequences = 0;   // running sequences then
  int64_t tokens = 0;      // their table slots (blocks per table x block size), i.e. tokens they have room for
  int64_t full_bytes = 0;  // what those slots cost with every layer keeping every block (no window release)
};

struct RunResult {
  std::vector<RequestOutput> outputs;  // in the order of the requests given
  double start_time = 0;               // steady-clock seconds; every request arrived then
  double end_time = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;  // prefix-cache hits at admission, in tokens
  KvPeak kv_peak;             // the run's largest KV cache use
  StepProfile profile;        // the run's steps (EngineConfig::profile_steps; all zero otherwise)
  // Every step of the run as scheduled (tokens, contexts, sampling rows): what its serial floor is computed from.
  std::vector<StepShape> step_shapes;

  ServingMetrics metrics() const;
};

class LLMEngine {
 public:
  // Sizes and allocates the KV cache (config.num_kv_blocks = 0: automatically, which on CUDA runs one
  // profile step of the model), then in graph mode captures the decode graphs.
  LLMEngine(CausalLM& model, Variant variant, Device device, const EngineConfig& config);
  // Tensor parallel: models[r] is rank r's shard, built on rank r's thread of `group` (which must outlive the
  // engine). Every rank gets a runner, the same number of KV blocks (the smallest any rank can hold) and, in
  // graph mode, its own graphs (captured on all ranks at once: the collectives are in them); each step runs
  // on all ranks, and rank 0's sampled tokens (equal on every rank: the logits are gathered) drive the
  // scheduler.
  LLMEngine(const std::vector<CausalLM*>& models, TensorParallelGroup& group, Variant variant,
            const EngineConfig& config);

  const EngineConfig& config() const { return config_; }  // num_kv_blocks resolved
  const KVCacheSizing& kv_cache_sizing() const { return sizing_; }
  const ModelRunner& runner() const { return *runners_[0]; }  // rank 0's: the captured graphs, graph steps
  int tp_size() const { return int(runners_.size()); }
  const Scheduler& scheduler() const { return *scheduler_; }
  int64_t num_steps() const { return steps_; }
  // Every profiled step so far (EngineConfig::profile_steps).
  const StepProfile& step_profile() const { return profile_; }
  int64_t num_preemptions() const { return scheduler_->num_preemptions(); }
  int64_t num_cached_tokens() const { return scheduler_->num_cached_tokens(); }

  // Throws naming the request and the problem (empty prompt, token id outside the vocabulary, too long for
  // max_model_len or for the whole KV cache, bad sampling parameters, duplicate id).
  void add_request(const Request& request, double arrival_time);
  void add_request(const Request& request) { add_request(request, now()); }
  bool has_unfinished() const { return scheduler_->has_unfinished(); }
  // Drops an unfinished request (its client went away): its KV blocks are freed at once. False when no unfinished
  // request has that id. The engine is single-threaded: call it between steps, from the thread that steps.
  bool abort_request(int64_t id);
  // One scheduled model step; returns the requests that finished in it. With async_scheduling the step is launched
  // and the one launched before it is collected: what finished is what that one's tokens ended.
  std::vector<RequestOutput> step();
  // Adds `requests` (all arriving now) and steps until every one has finished. `progress` is called after
  // every step. The engine must hold no other unfinished request.
  RunResult run_to_completion(const std::vector<Request>& requests,
                              const std::function<void(const EngineProgress&)>& progress = {});

  // Steady-clock seconds, the time base of arrival and token times.
  static double now();

 private:
  // Runs fn(rank) on every rank (on the group's threads with TP, else here).
  void for_each_rank(const std::function<void(int rank)>& fn);
  void init(const std::vector<CausalLM*>& models, Variant variant, const std::vector<Device>& devices);
  // The host half of a step whose tokens are sampled (per_rank: every rank's ids): the scheduler's complete(), the
  // KV peak, the finished requests into `outputs`, the step's shape and profile.
  void finish_step(const SchedulerOutput& out, const std::vector<std::vector<int64_t>>& per_rank, double schedule_s,
                   std::vector<RequestOutput>& outputs);
  // Collects and finishes the launched step in flight (async scheduling).
  void finish_in_flight(std::vector<RequestOutput>& outputs);

  EngineConfig config_;
  TensorParallelGroup* group_ = nullptr;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  KVCacheSizing sizing_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t vocab_size_;
  int64_t steps_ = 0;
  int64_t window_ = 0;              // the largest sliding window among the model's layers (0: none)
  int64_t kv_bytes_per_token_ = 0;  // rank 0's paged bytes of one token over all layers (KvPeak::full_bytes)
  StepProfile profile_;
  std::vector<StepShape>* step_shapes_ = nullptr;  // run_to_completion's result while it runs
  KvPeak* kv_peak_ = nullptr;                      // run_to_completion's result while it runs
  // Async scheduling: the launched step whose ids are not collected yet, and its scheduling time.
  std::optional<SchedulerOutput> in_flight_;
  double in_flight_schedule_s_ = 0;
  // Sequences that finished or were aborted while a launched step may still name them: kept until that step is
  // finished.
  std::vector<std::unique_ptr<Sequence>> retired_;
};

}  // namespace kbn::engine
