#include "engine/llm_engine.h"

#include <algorithm>
#include <unordered_map>

#include "engine/clock.h"
#include "engine/generate.h"

namespace kbn::engine {

namespace {

RequestOutput to_output(const Sequence& s) {
  RequestOutput o;
  o.id = s.id;
  o.num_prompt_tokens = int64_t(s.prompt.size());
  o.tokens = s.output;
  o.finish_reason = s.finish_reason;
  o.num_preemptions = s.num_preemptions;
  o.arrival_time = s.arrival_time;
  o.token_times = s.token_times;
  o.finish_time = s.finish_time;
  return o;
}

}  // namespace

ServingMetrics RunResult::metrics() const {
  ServingMetrics m = compute_metrics(outputs, end_time - start_time, steps, preemptions);
  m.cached_tokens = cached_tokens;
  return m;
}

double LLMEngine::now() { return steady_seconds(); }

LLMEngine::LLMEngine(CausalLM& model, Variant variant, Device device, const EngineConfig& config)
    : config_(config), vocab_size_(model.vocab_size()) {
  init({&model}, variant, {device});
}

LLMEngine::LLMEngine(const std::vector<CausalLM*>& models, TensorParallelGroup& group, Variant variant,
                     const EngineConfig& config)
    : config_(config), group_(&group) {
  KBN_CHECK(int(models.size()) == group.size(), "engine: ", models.size(), " model shards for a tensor-parallel group of ",
            group.size());
  for (const CausalLM* m : models) KBN_CHECK(m != nullptr, "engine: a tensor-parallel model shard is null");
  vocab_size_ = models[0]->vocab_size();
  std::vector<Device> devices;
  for (int r = 0; r < group.size(); ++r) devices.push_back(group.device_of(r));
  init(models, variant, devices);
}

void LLMEngine::for_each_rank(const std::function<void(int rank)>& fn) {
  if (group_)
    group_->run(fn);
  else
    fn(0);
}

void LLMEngine::init(const std::vector<CausalLM*>& models, Variant variant, const std::vector<Device>& devices) {
  const EngineConfig& config = config_;
  // The sliding window of the model's windowed layers, for the steps' serial-floor shapes.
  for (const LayerCacheSpec& spec : models[0]->cache_specs()) window_ = std::max(window_, spec.sliding_window);
  KBN_CHECK(config.max_model_len >= 2, "engine: max_model_len must be >= 2, got ", config.max_model_len,
            " (set it, e.g. to the model config's max_position_embeddings)");
  KBN_CHECK(config.num_kv_blocks >= 0, "engine: num_kv_blocks must be >= 0 (0 = automatic), got ",
            config.num_kv_blocks);
  KBN_CHECK(config.max_num_batched_tokens >= 1, "engine: max_num_batched_tokens must be >= 1, got ",
            config.max_num_batched_tokens);
  KBN_CHECK(config.max_num_seqs >= 1, "engine: max_num_seqs must be >= 1, got ", config.max_num_seqs);
  const bool stateful = has_state_layers(models[0]->cache_specs());
  KBN_CHECK(config.num_state_slots >= 0, "engine: num_state_slots must be >= 0 (0 = as many as fit), got ",
            config.num_state_slots);
  if (stateful) {
    // Given KV blocks skip the memory sizing: then 0 slots means one per possible running sequence.
    config_.num_state_slots = config.num_state_slots > 0 || config.num_kv_blocks == 0 ? config.num_state_slots
                                                                                      : config.max_num_seqs;
    config_.enable_prefix_caching = false;  // no state to resume a cached prefix from
  } else {
    config_.num_state_slots = 0;
  }
  const std::optional<DType> kv_dtype = parse_kv_cache_dtype(config.kv_cache_dtype, "engine: kv_cache_dtype");
  const int n = int(models.size());
  KBN_CHECK(!config.async_scheduling || n == 1, "engine: async_scheduling needs tensor-parallel size 1, got ", n);
  KBN_CHECK(!config.async_scheduling || !config.profile_steps,
            "engine: async_scheduling overlaps each step with the next one's host work; profile_steps times every "
            "step alone: turn one of them off");
  check_nano_batching(config.nano_batching, "engine: nano_batching");
  KBN_CHECK(config.nano_batching.count == 1 || n == 1, "engine: nano_batching.count ", config.nano_batching.count,
            " (overlapped nano-batches) needs tensor-parallel size 1, got ", n,
            ": each rank has one communicator and one peer-memory staging buffer, which the nano-batches' all-reduces "
            "would use at once from two streams");
  runners_.resize(size_t(n));
  for_each_rank([&](int r) {
    runners_[size_t(r)] = std::make_unique<ModelRunner>(*models[size_t(r)], variant, devices[size_t(r)],
                                                        config.block_size, config.mode, kv_dtype);
    runners_[size_t(r)]->set_nano_batching(config.nano_batching);
  });
  if (config.num_kv_blocks > 0) {
    sizing_.num_blocks = config.num_kv_blocks;
    sizing_.bytes_per_block = runners_[0]->kv_bytes_per_block();
    sizing_.num_state_slots = config_.num_state_slots;
    sizing_.explanation = "given: " + std::to_string(config.num_kv_blocks) + " blocks" +
                          (stateful ? ", " + std::to_string(config_.num_state_slots) + " state slots" : std::string());
  } else {
    std::vector<KVCacheSizing> per_rank(static_cast<size_t>(n));
    for_each_rank([&](int r) {
      per_rank[size_t(r)] = runners_[size_t(r)]->auto_num_kv_blocks(config.max_num_batched_tokens, config.max_num_seqs,
                                                                    config.max_model_len, config.gpu_memory_utilization,
                                                                    config_.num_state_slots);
    });
    size_t smallest = 0;
    for (size_t r = 1; r < per_rank.size(); ++r)
      if (per_rank[r].num_blocks < per_rank[smallest].num_blocks) smallest = r;
    sizing_ = per_rank[smallest];
    for (const KVCacheSizing& k : per_rank) sizing_.num_state_slots = std::min(sizing_.num_state_slots, k.num_state_slots);
    if (stateful) config_.num_state_slots = sizing_.num_state_slots;
    if (n > 1)
      sizing_.explanation = "the smallest of " + std::to_string(n) + " ranks, rank " + std::to_string(smallest) +
                            ": " + sizing_.explanation;
  }
  config_.num_kv_blocks = sizing_.num_blocks;
  for_each_rank([&](int r) {
    runners_[size_t(r)]->allocate_kv_cache(sizing_.num_blocks, config_.num_state_slots);
    if (config.mode == ExecutionMode::graph)
      runners_[size_t(r)]->capture_cuda_graphs(
          cuda_graph_capture_sizes(stateful ? std::min(config.max_num_seqs, config_.num_state_slots) : config.max_num_seqs,
                                   config.max_num_batched_tokens),
          config.max_model_len);
  });
  kv_bytes_per_token_ = runners_[0]->kv_bytes_per_token();
  for (auto& r : runners_) r->set_check_finite(config.check_finite);
  runners_[0]->set_profiling(config.profile_steps);  // rank 0's times stand for the step (ranks run in lockstep)
  blocks_ = std::make_unique<BlockManager>(sizing_.num_blocks, config.block_size, config_.enable_prefix_caching,
                                           runners_[0]->kv_group_windows());
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len,
                      config.reserve_max_tokens, config_.num_state_slots},
      *blocks_);
}

void LLMEngine::add_request(const Request& r, double arrival_time) {
  for (size_t i = 0; i < r.prompt.size(); ++i)
    KBN_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab_size_, "request ", r.id, ": prompt token ", i, " is ",
              r.prompt[i], ", outside the vocabulary [0, ", vocab_size_, ")");
  scheduler_->add(std::make_unique<Sequence>(r, arrival_time));
}

bool LLMEngine::abort_request(int64_t id) {
  std::unique_ptr<Sequence> s = scheduler_->abort(id);
  if (!s) return false;
  retired_.push_back(std::move(s));  // a launched step may still name it
  if (!scheduler_->has_unfinished()) {
    // Nothing left to step: the step in flight is collected now (its tokens all discarded), not by a later run's step.
    std::vector<RequestOutput> none;
    finish_in_flight(none);
  }
  return true;
}

std::vector<RequestOutput> LLMEngine::step() {
  const double t_schedule = now();
  SchedulerOutput out = scheduler_->schedule();
  const double schedule_s = now() - t_schedule;
  std::vector<RequestOutput> outputs;
  const bool greedy = std::all_of(out.seqs.begin(), out.seqs.end(),
                                  [](const ScheduledSequence& e) { return !e.samples || e.seq->sampling.greedy(); });
  if (config_.async_scheduling && !out.empty() && greedy) {
    // Launched before the step in flight is collected: the device runs it right after that one.
    runners_[0]->launch(out);
    scheduler_->commit(out);
    finish_in_flight(outputs);
    in_flight_ = std::move(out);
    in_flight_schedule_s_ = schedule_s;
    // Every request ended: the step just launched only carries tokens to discard.
    if (!scheduler_->has_unfinished()) finish_in_flight(outputs);
    return outputs;
  }
  const bool was_in_flight = in_flight_.has_value();
  finish_in_flight(outputs);  // its ids first: the runner collects in launch order
  // What the step in flight ended (EOS) while this step was scheduled has freed its blocks: it leaves this step, whose
  // token for it would be discarded anyway.
  const auto ended = [](const ScheduledSequence& e) { return e.seq->status == SequenceStatus::finished; };
  if (was_in_flight && std::any_of(out.seqs.begin(), out.seqs.end(), ended)) {
    out.num_prefills -= std::count_if(out.seqs.begin(), out.seqs.begin() + out.num_prefills, ended);
    out.seqs.erase(std::remove_if(out.seqs.begin(), out.seqs.end(), ended), out.seqs.end());
    out.num_tokens = 0;
    for (const ScheduledSequence& e : out.seqs) out.num_tokens += e.num_new_tokens;
  }
  if (out.empty()) return outputs;
  std::vector<std::vector<int64_t>> per_rank(runners_.size());
  for_each_rank([&](int r) { per_rank[size_t(r)] = runners_[size_t(r)]->execute(out); });
  scheduler_->commit(out);
  finish_step(out, per_rank, schedule_s, outputs);
  return outputs;
}

void LLMEngine::finish_in_flight(std::vector<RequestOutput>& outputs) {
  if (!in_flight_) return;
  const SchedulerOutput out = std::move(*in_flight_);
  in_flight_.reset();
  finish_step(out, {runners_[0]->collect()}, in_flight_schedule_s_, outputs);
}

void LLMEngine::finish_step(const SchedulerOutput& out, const std::vector<std::vector<int64_t>>& per_rank,
                            double schedule_s, std::vector<RequestOutput>& outputs) {
  for (size_t r = 1; r < per_rank.size(); ++r)
    KBN_CHECK(per_rank[r] == per_rank[0], "engine: tensor-parallel rank ", r,
              " sampled other tokens than rank 0 (the gathered logits must be identical on every rank)");
  const std::vector<int64_t>& sampled = per_rank[0];
  // The sampled ids are on the host now, so the step's device work is done: this is when the tokens exist.
  const double t = now();
  std::vector<std::unique_ptr<Sequence>> finished = scheduler_->complete(out, sampled, t);
  ++steps_;
  if (kv_peak_) {
    // After the step's releases; host integers only (the byte sizes were taken once, at start-up).
    const int64_t held = blocks_->num_blocks() - blocks_->num_free_blocks();
    if (held > kv_peak_->blocks) {
      KvPeak& p = *kv_peak_;
      p.blocks = held;
      p.bytes = held * sizing_.bytes_per_block;
      p.sequences = scheduler_->num_running();
      p.tokens = 0;
      for (const Sequence* s : scheduler_->running()) p.tokens += int64_t(s->block_table.size()) * config_.block_size;
      p.full_bytes = p.tokens * kv_bytes_per_token_;
    }
  }
  for (const auto& s : finished) outputs.push_back(to_output(*s));
  // The step in flight (async scheduling) may name what finished now; what finished before it was scheduled, no
  // launched step names any more.
  retired_ = std::move(finished);
  if (step_shapes_ || config_.profile_steps) {
    const double update_s = now() - t;
    // Host integers the scheduler already decided: no device work, a pass over the step's sequences.
    const StepShape shape = step_shape(out, window_);
    if (step_shapes_) step_shapes_->push_back(shape);
    if (config_.profile_steps)
      profile_.record(runners_[0]->last_step_times(), out.num_tokens, shape.prefill_tokens, schedule_s, update_s);
  }
}

RunResult LLMEngine::run_to_completion(const std::vector<Request>& requests,
                                       const std::function<void(const EngineProgress&)>& progress) {
  KBN_CHECK(!has_unfinished(), "engine: run_to_completion() needs an idle engine; ",
            scheduler_->num_waiting() + scheduler_->num_running(), " requests are still unfinished");
  RunResult res;
  std::unordered_map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[requests[i].id] = i;
  const int64_t steps0 = steps_, preemptions0 = num_preemptions(), cached0 = num_cached_tokens();
  const StepProfile profile0 = profile_;
  res.start_time = now();
  for (const Request& r : requests) add_request(r, res.start_time);
  // Steps record their shapes and the KV peak into the result while it runs; the guard stops that however the run
  // ends.
  step_shapes_ = &res.step_shapes;
  kv_peak_ = &res.kv_peak;
  struct StopRecording {
    LLMEngine& e;
    ~StopRecording() {
      e.step_shapes_ = nullptr;
      e.kv_peak_ = nullptr;
    }
  } stop_recording{*this};
  res.outputs.resize(requests.size());
  EngineProgress p;
  p.total = int64_t(requests.size());
  while (has_unfinished()) {
    for (RequestOutput& o : step()) {
      p.output_tokens += int64_t(o.tokens.size());
      ++p.finished;
      const size_t i = index.at(o.id);
      res.outputs[i] = std::move(o);
    }
    if (progress) {
      EngineProgress q = p;
      for (const Sequence* s : scheduler_->running()) q.output_tokens += int64_t(s->output.size());
      for (const Sequence* s : scheduler_->waiting()) q.output_tokens += int64_t(s->output.size());
      q.steps = steps_ - steps0;
      q.elapsed_s = now() - res.start_time;
      progress(q);
    }
  }
  res.end_time = now();
  res.steps = steps_ - steps0;
  res.preemptions = num_preemptions() - preemptions0;
  res.cached_tokens = num_cached_tokens() - cached0;
  res.profile = profile_.since(profile0);
  return res;
}

}  // namespace kbn::engine
