#pragma once
// Next-token sampling. Greedy rows use the registry's "argmax" op of the chosen variant, on the logits'
// device. Temperature / top-k / top-p rows are sampled on the host: the logits are copied to the CPU (one
// [rows, vocab] f32 transfer per step that has such a row), which keeps the rule simple to read and exactly
// reproducible; it is not the fast path a GPU sampler would be.
//
// Randomness is counter-based: token i of a request's output draws u = Philox4x32-10(counter = i,
// key = seed), so a token depends only on (seed, i, logits), not on batching, scheduling or preemption.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/sequence.h"
#include "kbn/registry.h"

namespace kbn::engine {

// Samples one token from a row of f32 logits: temperature scaling, then top-k (ties broken towards the lower
// token id), then top-p over the renormalised top-k mass (the smallest most-likely set reaching top_p, at
// least one token), then inverse-CDF sampling with the Philox draw for (params.seed, output_index). NaN
// logits never win. Greedy params return the argmax (lowest id on ties).
int64_t sample_from_logits(const float* logits, int64_t vocab, const SamplingParams& params, int64_t output_index);

class Sampler {
 public:
  explicit Sampler(Variant variant);
  // logits: [n, vocab] f32 on any device; params[i] and output_index[i] belong to row i (output_index = the
  // number of tokens that row's sequence has generated so far) -> n token ids.
  std::vector<int64_t> sample(const Tensor& logits, const std::vector<const SamplingParams*>& params,
                              const std::vector<int64_t>& output_index);
  // The greedy ids of every row of logits ([n, vocab]), left on the logits' device as [n] i64: no transfer, no
  // synchronisation (async scheduling reads them later).
  Tensor argmax(const Tensor& logits);

 private:
  std::unique_ptr<AnyOp> argmax_;
};

}  // namespace kbn::engine
