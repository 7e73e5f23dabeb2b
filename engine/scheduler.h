#pragma once
// Continuous batching with one token budget per step (vLLM V1's scheduler): every step, running sequences
// that decode get one token each, then running sequences still in (chunked) prefill get what is left of the
// budget, then waiting requests are admitted first-come first-served, each prefill chunked to fit. When a
// running sequence cannot get a KV block, the most recently admitted running sequence is preempted by
// recompute: its blocks are freed, its num_computed_tokens reset to 0, and it goes back to the front of the
// waiting queue keeping the tokens it generated (they are re-prefilled with its prompt, or found in the prefix
// cache when BlockManager has it on and its blocks were not evicted in the meantime).
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace kbn::engine {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 8192;  // token budget of one step
  int64_t max_num_seqs = 256;             // running sequences at most
  int64_t max_model_len = 0;              // prompt + output tokens of one sequence at most (required)
  // Admission: false (vLLM's) admits a request whenever its prompt's blocks are free, and preempts when the
  // running ones outgrow the cache; true admits it only if the blocks every running request needs to reach its
  // max_tokens stay available too, so that no request that stops at max_tokens (or earlier) is ever preempted,
  // at the price of a cache that is not full while requests could still stop early at EOS.
  bool reserve_max_tokens = false;
  // Models with recurrent-state layers: the state slots there are. A running sequence holds one (taken at
  // admission, returned when it finishes, is preempted or aborted), so at most this many sequences run at once.
  // 0: no state layers.
  int64_t num_state_slots = 0;
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int64_t num_computed_tokens = 0;  // tokens already in the cache (the first new token's position)
  int64_t num_new_tokens = 0;       // tokens computed this step (the query length)
  // The chunk reaches the sequence's last token, so a token is sampled from its last position this step.
  bool samples = false;
};

// Whether a scheduled chunk runs as a prefill: more than one new token, or, in a model with recurrent-state layers
// (`stateful`), a sequence's first token (a one-token prompt): the decode kernels continue a state, they do not
// start one from zero.
inline bool runs_as_prefill(const ScheduledSequence& e, bool stateful) {
  return e.num_new_tokens > 1 || (stateful && e.num_computed_tokens == 0);
}

struct SchedulerOutput {
  // Prefills (runs_as_prefill: query length > 1, or a stateful model's first token) first, then decodes: the order
  // kbn::AttentionMetadata requires. Within each group, budget order (running before newly admitted).
  std::vector<ScheduledSequence> seqs;
  int64_t num_prefills = 0;
  int64_t num_tokens = 0;              // sum of num_new_tokens
  std::vector<int64_t> preempted_ids;  // sequences preempted while building this step

  int64_t num_decodes() const { return int64_t(seqs.size()) - num_prefills; }
  int64_t num_sampling() const;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  const SchedulerConfig& config() const { return config_; }
  // Takes a new sequence (status waiting, nothing computed); it is served after those already waiting.
  void add(std::unique_ptr<Sequence> seq);
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prompt (and, after preemption, output) tokens whose KV admission found in the prefix cache, in total.
  int64_t num_cached_tokens() const { return num_cached_tokens_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }  // in admission order

  // Picks this step's tokens and allocates their KV blocks. Empty only when nothing is unfinished.
  SchedulerOutput schedule();
  // After the model ran `out`: advances num_computed_tokens, appends `sampled` (one token per entry of
  // out.seqs with samples = true, in that order) stamped `now`, and applies the stop rules (EOS unless
  // ignore_eos, max_tokens, max_model_len). Returns the sequences that finished; their blocks are freed.
  // The same as commit(out) then complete(out, sampled, now).
  std::vector<std::unique_ptr<Sequence>> update(const SchedulerOutput& out, const std::vector<int64_t>& sampled,
                                                double now);

  // Async scheduling splits update() in two. commit(out), once `out` is launched: its tokens count as computed
  // (num_computed_tokens advances, sliding windows release what no later token sees) and every sequence that samples
  // holds a pending token (Sequence::num_pending), so the next step can be scheduled before the sampled ids reach the
  // host. A sequence whose pending token ends it by length (max_tokens, max_model_len) is not scheduled again.
  void commit(const SchedulerOutput& out);
  // complete(out, sampled, now), once the ids are on the host: each pending token becomes `sampled`'s, full blocks of
  // known tokens are cached, and the stop rules apply. Entries of sequences that finished (or were aborted) after
  // `out` was scheduled are skipped: their token is discarded. A sequence preempted meanwhile keeps its token (it is
  // re-prefilled with the rest). The Sequence objects of `out` must still exist (LLMEngine keeps finished ones until
  // no launched step names them).
  std::vector<std::unique_ptr<Sequence>> complete(const SchedulerOutput& out, const std::vector<int64_t>& sampled,
                                                  double now);
  // True when s's pending token will end it by length, whatever its id: it waits for complete() unscheduled.
  bool ends_with_pending(const Sequence& s) const;

  // Drops the unfinished request `id` (waiting or running: its blocks are freed) and returns it, finish reason
  // `aborted`; nullptr when no unfinished request has that id. Call between steps, not during one.
  std::unique_ptr<Sequence> abort(int64_t id);

  // BlockManager::check_invariants over every sequence held here; also checks the running bound.
  void check_invariants() const;

 private:
  // Allocates blocks so `seq` covers `num_tokens` tokens, preempting from the back of running_ while blocks
  // are short. Returns false when `seq` itself had to be preempted.
  bool allocate_or_preempt(Sequence* seq, int64_t num_tokens, SchedulerOutput& out, int64_t& budget);
  void preempt(Sequence* victim, SchedulerOutput& out, int64_t& budget);

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::vector<std::unique_ptr<Sequence>> owned_;  // every unfinished sequence
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  int64_t num_preemptions_ = 0;
  int64_t num_cached_tokens_ = 0;
  std::vector<int32_t> free_state_slots_;  // taken from the back

  void release_state_slot(Sequence& s);
  // Marks s finished (`reason`, `now`), frees its blocks and state slot, and moves it out of the scheduler.
  std::unique_ptr<Sequence> finish(Sequence* s, FinishReason reason, double now);
};

}  // namespace kbn::engine
