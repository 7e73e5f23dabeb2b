#include "engine/step_profile.h"

namespace kbn::engine {

void StepKindTotals::add(const StepKindTotals& o) {
  steps += o.steps;
  tokens += o.tokens;
  prefill_tokens += o.prefill_tokens;
  wall_s += o.wall_s;
  schedule_s += o.schedule_s;
  update_s += o.update_s;
  prepare_s += o.prepare_s;
  forward_s += o.forward_s;
  logits_s += o.logits_s;
  sample_s += o.sample_s;
}

void StepKindTotals::subtract(const StepKindTotals& o) {
  steps -= o.steps;
  tokens -= o.tokens;
  prefill_tokens -= o.prefill_tokens;
  wall_s -= o.wall_s;
  schedule_s -= o.schedule_s;
  update_s -= o.update_s;
  prepare_s -= o.prepare_s;
  forward_s -= o.forward_s;
  logits_s -= o.logits_s;
  sample_s -= o.sample_s;
}

StepKindTotals StepProfile::total() const {
  StepKindTotals t = decode_graph;
  t.add(decode_eager);
  t.add(prefill);
  return t;
}

void StepProfile::record(const StepTimes& times, int64_t tokens, int64_t prefill_tokens, double schedule_s,
                         double update_s) {
  StepKindTotals& k = times.graph ? decode_graph : prefill_tokens > 0 ? prefill : decode_eager;
  ++k.steps;
  k.tokens += tokens;
  k.prefill_tokens += prefill_tokens;
  k.wall_s += schedule_s + times.execute_s + update_s;
  k.schedule_s += schedule_s;
  k.update_s += update_s;
  k.prepare_s += times.prepare_s;
  k.forward_s += times.forward_s;
  k.logits_s += times.logits_s;
  const double rest = times.execute_s - times.prepare_s - times.forward_s - times.logits_s;
  k.sample_s += rest > 0 ? rest : 0;
}

StepProfile StepProfile::since(const StepProfile& earlier) const {
  StepProfile d = *this;
  d.decode_graph.subtract(earlier.decode_graph);
  d.decode_eager.subtract(earlier.decode_eager);
  d.prefill.subtract(earlier.prefill);
  return d;
}

void StepProfile::add(const StepProfile& o) {
  decode_graph.add(o.decode_graph);
  decode_eager.add(o.decode_eager);
  prefill.add(o.prefill);
}

}  // namespace kbn::engine
