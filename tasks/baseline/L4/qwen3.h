#pragma once
// Qwen3Model and Qwen3ForCausalLM (vLLM vllm/model_executor/models/qwen3.py; Qwen3Model is vLLM's Qwen2Model
// with Qwen3DecoderLayer), serving HF architecture "Qwen3ForCausalLM" (the dense Qwen3 models).
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/qwen3_decoder_layer.h"
#include "configs/qwen3.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Qwen3Model : public Module {
 public:
  Qwen3Model(const Qwen3Config& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<Qwen3DecoderLayer>> layers;
  RMSNorm norm;
};

class Qwen3ForCausalLM : public CausalLM {
 public:
  Qwen3ForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const Qwen3Config& config() const { return config_; }

 private:
  Qwen3Config config_;
  DType dtype_;

 public:
  Qwen3Model model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
