#include "engine/step_profile.h"

namespace kbn::engine {

void StepKindTotals::add(const StepKindTotals& o, int sign) {
  steps += sign * o.steps;
  tokens += sign * o.tokens;
  prefill_tokens += sign * o.prefill_tokens;
  wall_s += sign * o.wall_s;
  schedule_s += sign * o.schedule_s;
  update_s += sign * o.update_s;
  prepare_s += sign * o.prepare_s;
  forward_s += sign * o.forward_s;
  logits_s += sign * o.logits_s;
  sample_s += sign * o.sample_s;
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
  d.decode_graph.add(earlier.decode_graph, -1);
  d.decode_eager.add(earlier.decode_eager, -1);
  d.prefill.add(earlier.prefill, -1);
  return d;
}

void StepProfile::add(const StepProfile& o) {
  decode_graph.add(o.decode_graph);
  decode_eager.add(o.decode_eager);
  prefill.add(o.prefill);
}

}  // namespace kbn::engine
