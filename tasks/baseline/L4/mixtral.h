#pragma once
// MixtralModel and MixtralForCausalLM (vLLM vllm/model_executor/models/mixtral.py), serving HF architecture
// "MixtralForCausalLM". Checkpoint experts `block_sparse_moe.experts.{e}.w1/w3/w2` stack into FusedMoE's w13/w2.
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/mixtral_decoder_layer.h"
#include "configs/mixtral.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class MixtralModel : public Module {
 public:
  MixtralModel(const MixtralConfig& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<MixtralDecoderLayer>> layers;
  RMSNorm norm;
};

class MixtralForCausalLM : public CausalLM {
 public:
  MixtralForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const MixtralConfig& config() const { return config_; }

 private:
  MixtralConfig config_;
  DType dtype_;

 public:
  MixtralModel model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
