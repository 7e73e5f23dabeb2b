#pragma once
// Where a serving run's time goes, step by step (kb_nano eval prints it and writes it to its JSON): the host's
// scheduling and bookkeeping around each step, the host building the step's inputs, and the device spans of the
// model forward and of the logits (CUDA events on the step's stream; wall time on CPU), summed by kind of step.
#include <cstdint>

namespace kbn::engine {

// One ModelRunner::execute().
struct StepTimes {
  double prepare_s = 0;  // host: the step's input tensors and attention metadata built and queued (eager steps)
  double forward_s = 0;  // device span of the model forward (graph steps: the replay, its input updates included)
  double logits_s = 0;   // device span of the sampling rows' gather and the LM head
  double execute_s = 0;  // host wall of the whole execute(), until the sampled ids are on the host
  bool graph = false;    // served by a CUDA graph replay
  int nano_batches = 1;  // overlapped nano-batches it ran as (engine/nano_batch.h)
};

// Sums over the steps of one kind.
struct StepKindTotals {
  int64_t steps = 0;
  int64_t tokens = 0;          // scheduled tokens (prompt chunks, recomputation after preemption, decodes)
  int64_t prefill_tokens = 0;  // of which in chunks longer than one token
  double wall_s = 0;           // schedule + execute + update
  double schedule_s = 0;       // host: the scheduler building the step
  double update_s = 0;         // host: appending the sampled tokens, finishing and freeing sequences
  double prepare_s = 0, forward_s = 0, logits_s = 0;  // as in StepTimes
  // execute - prepare - forward - logits: sampling, the copy of the ids back, and any time the device waited
  // for the host to launch work.
  double sample_s = 0;

  void add(const StepKindTotals& o, int sign = 1);  // sign -1: subtract
};

struct StepProfile {
  StepKindTotals decode_graph;  // decode-only steps replayed from a CUDA graph
  StepKindTotals decode_eager;  // decode-only steps launched kernel by kernel
  StepKindTotals prefill;       // steps with at least one chunk longer than one token (decodes may ride along)

  StepKindTotals total() const;
  // One step: `times` from rank 0's runner, the host spans measured around it by the engine.
  void record(const StepTimes& times, int64_t tokens, int64_t prefill_tokens, double schedule_s, double update_s);
  // The steps recorded since `earlier` (a copy of this profile taken then).
  StepProfile since(const StepProfile& earlier) const;
  void add(const StepProfile& o);
};

}  // namespace kbn::engine
