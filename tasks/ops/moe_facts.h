#pragma once
// Test facts shared by the mixture-of-experts blocks' facts files (tasks/ops/L2..L3): the expert weights a step
// touches and the expert FLOPs, added to the generic block cases (which count the dense weights and activations).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kbn/dtype.h"
#include "kbn/model_view.h"
#include "kbn/op_case.h"

namespace kbn::ops {

// Distinct experts the top_k choices of `tokens` tokens touch, expected under uniform routing (the cases' router
// logits are i.i.d.): E (1 - (1 - k / E)^T), rounded up, at least one.
inline int64_t touched_experts(const MoeShape& e, int64_t tokens) {
  const double E = double(e.num_experts), p = double(e.top_k) / E;
  const double touched = E * (1.0 - std::pow(1.0 - p, double(tokens)));
  return std::clamp<int64_t>(int64_t(std::ceil(touched - 1e-9)), 1, e.num_experts);
}

// One expert's weights (gate, up, down) on this rank.
inline int64_t expert_params(const ModelView& m) { return 3 * m.hidden_size * m.moe->intermediate_size; }

// Adds to each case the touched experts' weights (read once) and the expert GEMMs' FLOPs, 2 T k 3 H N.
inline void add_expert_work(std::vector<BenchCase>& cs, const ModelView& m) {
  for (auto& c : cs) {
    const int64_t es = int64_t(dtype_size(c.dtype)), T = c.tokens;
    c.bytes += touched_experts(*m.moe, T) * expert_params(m) * es;
    c.flops += 2 * T * m.moe->top_k * expert_params(m);
    c.note = "bytes: the dense weights and the experts uniform routing touches once, the step's activations; FLOPs "
             "of the experts each token chose";
  }
}

}  // namespace kbn::ops
