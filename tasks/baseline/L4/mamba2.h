#pragma once
// Mamba2Model and Mamba2ForCausalLM (vLLM vllm/model_executor/models/mamba2.py), serving HF architecture
// "Mamba2ForCausalLM" (Mamba-Codestral-7B). Every layer is a MambaMixer2 with a recurrent state and no KV cache: the
// model declares a state cache per layer, and the engine gives each running sequence a state slot.
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/mamba2_decoder_layer.h"
#include "configs/mamba2.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Mamba2Model : public Module {
 public:
  Mamba2Model(const Mamba2Config& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids);

  VocabParallelEmbedding embeddings;
  std::vector<std::unique_ptr<Mamba2DecoderLayer>> layers;
  RMSNorm norm_f;
};

class Mamba2ForCausalLM : public CausalLM {
 public:
  Mamba2ForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  // positions are not read (a recurrent model has none), only checked for shape by the caller.
  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const Mamba2Config& config() const { return config_; }

 private:
  Mamba2Config config_;
  DType dtype_;

 public:
  Mamba2Model backbone;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
