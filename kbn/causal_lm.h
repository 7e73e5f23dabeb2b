#pragma once
// What the engine, the CLI and the loader see of an L4 model: the registry's L4 interface. A new
// architecture implements this; the engine needs no branch for it unless its cache is genuinely new.
#include <functional>
#include <string>

#include "kbn/forward_context.h"
#include "kbn/module.h"

namespace kbn {

// Shape of the paged KV cache one model needs per layer (per tensor-parallel rank).
struct KVCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  DType dtype = DType::f32;
};

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
  virtual KVCacheSpec kv_cache_spec() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace kbn
