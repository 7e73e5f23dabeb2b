#pragma once
// What the engine, the CLI and the loader see of an L4 model: the registry's L4 interface. A new
// architecture implements this; the engine needs no branch for it unless its cache is genuinely new.
#include <functional>
#include <string>
#include <vector>

#include "kbn/cache_spec.h"
#include "kbn/forward_context.h"
#include "kbn/module.h"

namespace kbn {

// Yields (HF name, tensor) pairs from a checkpoint; the callback may be called in any order.
using WeightVisitor = std::function<void(const std::string& name, const Tensor& tensor)>;
using WeightSource = std::function<void(const WeightVisitor&)>;

class CausalLM : public Module {
 public:
  // input_ids, positions: [num_tokens] (i64) -> hidden states [num_tokens, hidden_size]. Attention metadata
  // and KV caches come from the forward context.
  virtual Tensor forward(const Tensor& input_ids, const Tensor& positions) = 0;
  // hidden_states [n, hidden_size] -> logits [n, vocab_size] (f32)
  virtual Tensor compute_logits(const Tensor& hidden_states) = 0;
  // Maps checkpoint names onto parameters (stacked q/k/v, gate/up, tied embeddings, TP shards) and throws
  // naming any checkpoint tensor it cannot place or any parameter left unfilled.
  virtual void load_weights(const WeightSource& weights) = 0;
  // What every layer keeps between steps (this rank's share), one entry per layer in layer order; the engine
  // allocates and sizes its caches from this alone.
  virtual std::vector<LayerCacheSpec> cache_specs() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace kbn
