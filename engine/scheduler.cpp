#include "engine/scheduler.h"

#include <algorithm>

#include "kbn/error.h"

namespace kbn::engine {

int64_t SchedulerOutput::num_sampling() const {
  return std::count_if(seqs.begin(), seqs.end(), [](const ScheduledSequence& s) { return s.samples; });
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks) : config_(config), blocks_(blocks) {
  KBN_CHECK(config.max_num_batched_tokens >= 1, "scheduler: max_num_batched_tokens must be >= 1, got ",
            config.max_num_batched_tokens);
  KBN_CHECK(config.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got ", config.max_num_seqs);
  KBN_CHECK(config.max_model_len >= 2, "scheduler: max_model_len must be >= 2 (a prompt token and a new one), got ",
            config.max_model_len);
  KBN_CHECK(config.num_state_slots >= 0 && config.num_state_slots <= INT32_MAX,
            "scheduler: num_state_slots must be >= 0, got ", config.num_state_slots);
  for (int64_t i = config.num_state_slots - 1; i >= 0; --i) free_state_slots_.push_back(int32_t(i));
}

void Scheduler::release_state_slot(Sequence& s) {
  if (s.state_slot < 0) return;
  free_state_slots_.push_back(s.state_slot);
  s.state_slot = -1;
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  KBN_CHECK(seq != nullptr, "scheduler: add() needs a sequence");
  KBN_CHECK(!seq->prompt.empty(), "request ", seq->id, ": the prompt is empty");
  KBN_CHECK(int64_t(seq->prompt.size()) < config_.max_model_len, "request ", seq->id, ": prompt of ",
            seq->prompt.size(), " tokens leaves no room for a new token within max_model_len ", config_.max_model_len);
  seq->sampling.validate();
  // A sequence alone must fit in the whole cache; otherwise preempting everything else could not save it.
  const int64_t max_len = std::min(int64_t(seq->prompt.size()) + seq->sampling.max_tokens, config_.max_model_len);
  const int64_t most = blocks_.max_blocks_held(max_len, config_.max_num_batched_tokens);
  KBN_CHECK(most <= blocks_.num_blocks(), "request ", seq->id, ": up to ", max_len, " tokens need ", most,
            " KV blocks of ", blocks_.block_size(), " tokens but the cache has ", blocks_.num_blocks(),
            " (raise the number of KV blocks or lower max_tokens / max_model_len)");
  for (const auto& o : owned_) KBN_CHECK(o->id != seq->id, "request id ", seq->id, " is already in the engine");
  seq->status = SequenceStatus::waiting;
  seq->num_computed_tokens = 0;
  waiting_.push_back(seq.get());
  owned_.push_back(std::move(seq));
}

void Scheduler::preempt(Sequence* victim, SchedulerOutput& out, int64_t& budget) {
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  auto it = std::find_if(out.seqs.begin(), out.seqs.end(), [&](const ScheduledSequence& s) { return s.seq == victim; });
  if (it != out.seqs.end()) {  // scheduled earlier in this step (a decode, when a prefill needs its blocks)
    budget += it->num_new_tokens;
    out.num_tokens -= it->num_new_tokens;
    out.seqs.erase(it);
  }
  blocks_.free(*victim);
  release_state_slot(*victim);  // recompute rebuilds the state from the first token
  victim->num_computed_tokens = 0;
  victim->status = SequenceStatus::waiting;
  victim->num_preemptions++;
  num_preemptions_++;
  waiting_.push_front(victim);
  out.preempted_ids.push_back(victim->id);
}

bool Scheduler::allocate_or_preempt(Sequence* seq, int64_t num_tokens, SchedulerOutput& out, int64_t& budget) {
  while (!blocks_.can_allocate(*seq, num_tokens)) {
    // The lowest priority is the most recently admitted; seq itself is running, so running_ is not empty.
    Sequence* victim = running_.back();
    preempt(victim, out, budget);
    if (victim == seq) return false;
  }
  blocks_.allocate(*seq, num_tokens);
  return true;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  auto add_entry = [&](Sequence* s, int64_t n) {
    out.seqs.push_back({s, s->num_computed_tokens, n, s->num_computed_tokens + n == s->num_tokens()});
    out.num_tokens += n;
    budget -= n;
  };
  auto scheduled = [&](const Sequence* s) {
    return std::any_of(out.seqs.begin(), out.seqs.end(), [&](const ScheduledSequence& e) { return e.seq == s; });
  };

  // Running sequences: decodes (one uncomputed token) first, then those still in prefill. running_ only
  // shrinks from the back while this runs, never below index i.
  for (bool decodes : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* s = running_[i];
      if ((s->num_uncomputed_tokens() == 1) != decodes || scheduled(s) || ends_with_pending(*s)) continue;
      const int64_t n = std::min(s->num_uncomputed_tokens(), budget);
      if (allocate_or_preempt(s, s->num_computed_tokens + n, out, budget)) add_entry(s, n);
    }
  }

  // New requests, first come first served, while nothing was preempted in this step (a preempted sequence
  // is at the front of the queue and would be re-admitted into the same shortage).
  // With prefix caching a request's leading blocks may already be cached: they are taken instead of computed,
  // and only the rest of its tokens count against the budget.
  // reserve_max_tokens: the blocks the running sequences will still take before they reach max_tokens (a sliding
  // KV cache group holds its window's blocks at most).
  auto final_len = [&](const Sequence& s) {
    return std::min(int64_t(s.prompt.size()) + s.sampling.max_tokens, config_.max_model_len);
  };
  // The most tokens s computes in one step from `computed` on: a prefill chunk, then one.
  auto max_chunk = [&](const Sequence& s, int64_t computed) {
    return std::clamp<int64_t>(s.num_tokens() - computed, 1, config_.max_num_batched_tokens);
  };
  int64_t reserved = 0;
  if (config_.reserve_max_tokens)
    for (const Sequence* s : running_)
      reserved += blocks_.blocks_to_finish(*s, final_len(*s), max_chunk(*s, s->num_computed_tokens));
  const bool stateful = config_.num_state_slots > 0;
  while (out.preempted_ids.empty() && !waiting_.empty() && budget > 0 &&
         int64_t(running_.size()) < config_.max_num_seqs && (!stateful || !free_state_slots_.empty())) {
    Sequence* s = waiting_.front();
    // A preempted sequence whose last token is still being sampled comes back once its id is known (the prefix
    // cache hashes token ids); FCFS: nothing overtakes it.
    if (s->num_pending > 0) break;
    const BlockManager::PrefixMatch cached = blocks_.match_prefix(*s);
    const int64_t cached_tokens = cached.num_blocks() * blocks_.block_size();
    const int64_t n = std::min(s->num_tokens() - cached_tokens, budget);
    // Cached blocks no sequence holds are counted free until taken; taking them also removes them from the pool.
    // Every KV cache group's table grows by the same number of blocks.
    const int64_t table_blocks = blocks_.blocks_for(cached_tokens + n);
    const int64_t need = blocks_.num_groups() * (table_blocks - cached.num_blocks());
    const int64_t later =
        config_.reserve_max_tokens
            ? blocks_.blocks_to_finish(cached, table_blocks, final_len(*s), max_chunk(*s, cached_tokens + n))
            : 0;
    // FCFS: a later request does not overtake the first
    if (need + later + reserved > blocks_.num_free_blocks() - cached.evictable) break;
    reserved += later;
    blocks_.take_prefix(*s, cached);
    blocks_.allocate(*s, cached_tokens + n);
    num_cached_tokens_ += cached_tokens;
    waiting_.pop_front();
    if (stateful) {
      s->state_slot = free_state_slots_.back();
      free_state_slots_.pop_back();
    }
    s->status = SequenceStatus::running;
    running_.push_back(s);
    add_entry(s, n);
  }

  const auto prefill = [stateful](const ScheduledSequence& e) { return runs_as_prefill(e, stateful); };
  std::stable_partition(out.seqs.begin(), out.seqs.end(), prefill);
  out.num_prefills = std::count_if(out.seqs.begin(), out.seqs.end(), prefill);
  // Async scheduling: every unfinished sequence may be waiting for a pending token (its last, or one it must
  // re-prefill), which only complete() resolves.
  const auto pending = [](const auto& o) { return o->num_pending > 0; };
  KBN_CHECK(!out.empty() || !has_unfinished() || std::any_of(owned_.begin(), owned_.end(), pending),
            "scheduler: nothing could be scheduled with ", waiting_.size(),
            " waiting and ", running_.size(), " running sequences (", blocks_.num_free_blocks(), " of ",
            blocks_.num_blocks(), " KV blocks free)");
  return out;
}

bool Scheduler::ends_with_pending(const Sequence& s) const {
  return s.num_pending > 0 &&
         (int64_t(s.output.size()) + s.num_pending >= s.sampling.max_tokens || s.num_tokens() >= config_.max_model_len);
}

std::vector<std::unique_ptr<Sequence>> Scheduler::update(const SchedulerOutput& out,
                                                         const std::vector<int64_t>& sampled, double now) {
  commit(out);
  return complete(out, sampled, now);
}

void Scheduler::commit(const SchedulerOutput& out) {
  for (const ScheduledSequence& e : out.seqs) {
    Sequence* s = e.seq;
    KBN_CHECK(s->status == SequenceStatus::running && s->num_computed_tokens == e.num_computed_tokens,
              "scheduler: commit() of a step whose sequence ", s->id, " is no longer as it was scheduled");
    s->num_computed_tokens = e.num_computed_tokens + e.num_new_tokens;
    // Sliding-window groups give back the blocks no later token of s can see (registered ones stay cached). The
    // launched step may still read them: any new owner writes them in a later step, on the same stream.
    blocks_.release_outside_windows(*s);
    if (e.samples) s->num_pending++;
  }
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* s, FinishReason reason, double now) {
  s->finish_reason = reason;
  s->status = SequenceStatus::finished;
  s->finish_time = now;
  blocks_.free(*s);
  release_state_slot(*s);
  // A sequence preempted while its last token was in flight finishes from the waiting queue.
  if (auto r = std::find(running_.begin(), running_.end(), s); r != running_.end()) running_.erase(r);
  if (auto w = std::find(waiting_.begin(), waiting_.end(), s); w != waiting_.end()) waiting_.erase(w);
  auto it = std::find_if(owned_.begin(), owned_.end(), [&](const auto& o) { return o.get() == s; });
  std::unique_ptr<Sequence> done = std::move(*it);
  owned_.erase(it);
  return done;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::complete(const SchedulerOutput& out,
                                                           const std::vector<int64_t>& sampled, double now) {
  KBN_CHECK(int64_t(sampled.size()) == out.num_sampling(), "scheduler: ", sampled.size(),
            " sampled tokens for a step where ", out.num_sampling(), " sequences sample");
  std::vector<std::unique_ptr<Sequence>> finished;
  size_t k = 0;
  for (const ScheduledSequence& e : out.seqs) {
    Sequence* s = e.seq;
    const int64_t token = e.samples ? sampled[k++] : -1;
    if (s->status == SequenceStatus::finished) continue;  // ended (or aborted) after this step was scheduled
    if (e.samples) {
      KBN_CHECK(s->num_pending > 0, "scheduler: sequence ", s->id, " samples in a step that was not committed");
      s->num_pending--;
      s->output.push_back(token);
      s->token_times.push_back(now);
    }
    // A preempted sequence holds no blocks; it is re-prefilled with every token it has.
    if (s->status == SequenceStatus::running) blocks_.cache_full_blocks(*s);
    if (!e.samples) continue;
    // With a token still pending (the next step is launched) only EOS can end s here: schedule() does not launch a
    // step a length rule would discard.
    const auto& eos = s->sampling.eos_token_ids;
    FinishReason reason = FinishReason::none;
    if (!s->sampling.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end())
      reason = FinishReason::eos;
    else if (int64_t(s->output.size()) >= s->sampling.max_tokens)
      reason = FinishReason::max_tokens;
    else if (s->num_known_tokens() >= config_.max_model_len)
      reason = FinishReason::max_model_len;
    if (reason != FinishReason::none) finished.push_back(finish(s, reason, now));
  }
  return finished;
}

std::unique_ptr<Sequence> Scheduler::abort(int64_t id) {
  auto it = std::find_if(owned_.begin(), owned_.end(), [&](const auto& o) { return o->id == id; });
  if (it == owned_.end()) return nullptr;
  return finish(it->get(), FinishReason::aborted, 0.0);
}

void Scheduler::check_invariants() const {
  KBN_CHECK(int64_t(running_.size()) <= config_.max_num_seqs, "scheduler invariant: ", running_.size(),
            " running sequences > max_num_seqs ", config_.max_num_seqs);
  KBN_CHECK(running_.size() + waiting_.size() == owned_.size(), "scheduler invariant: ", running_.size(), " running + ",
            waiting_.size(), " waiting != ", owned_.size(), " unfinished sequences");
  for (const Sequence* s : running_)
    KBN_CHECK(s->status == SequenceStatus::running, "scheduler invariant: sequence ", s->id,
              " is in the running list with another status");
  for (const Sequence* s : waiting_)
    KBN_CHECK(s->status == SequenceStatus::waiting && s->num_computed_tokens == 0 && s->block_table.empty(),
              "scheduler invariant: waiting sequence ", s->id, " has status ", int(s->status), ", ",
              s->num_computed_tokens, " computed tokens and ", s->block_table.size(), " blocks");
  std::vector<const Sequence*> holders;
  for (const auto& o : owned_) holders.push_back(o.get());
  blocks_.check_invariants(holders);
  // State slots: every running sequence holds one (when the model has state), no waiting one does, none is held
  // twice, and held + free = all.
  std::vector<int32_t> held;
  for (const Sequence* s : running_) {
    KBN_CHECK((s->state_slot >= 0) == (config_.num_state_slots > 0), "scheduler invariant: running sequence ", s->id,
              " holds state slot ", s->state_slot, " with ", config_.num_state_slots, " slots in the engine");
    if (s->state_slot >= 0) held.push_back(s->state_slot);
  }
  for (const Sequence* s : waiting_)
    KBN_CHECK(s->state_slot < 0, "scheduler invariant: waiting sequence ", s->id, " holds state slot ", s->state_slot);
  std::vector<int32_t> all = held;
  all.insert(all.end(), free_state_slots_.begin(), free_state_slots_.end());
  std::sort(all.begin(), all.end());
  KBN_CHECK(int64_t(all.size()) == config_.num_state_slots && std::adjacent_find(all.begin(), all.end()) == all.end(),
            "scheduler invariant: ", held.size(), " held + ", free_state_slots_.size(), " free state slots are not the ",
            config_.num_state_slots, " slots, each once");
}

}  // namespace kbn::engine
