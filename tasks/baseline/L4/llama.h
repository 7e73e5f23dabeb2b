#pragma once
// LlamaModel and LlamaForCausalLM (vLLM vllm/model_executor/models/llama.py), serving HF architecture
// "LlamaForCausalLM" (Llama 2, 3, 3.1, 3.2).
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/llama_decoder_layer.h"
#include "kbn/causal_lm.h"
#include "configs/llama.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class LlamaModel : public Module {
 public:
  LlamaModel(const LlamaConfig& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<LlamaDecoderLayer>> layers;
  RMSNorm norm;
};

class LlamaForCausalLM : public CausalLM {
 public:
  LlamaForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const LlamaConfig& config() const { return config_; }

 private:
  LlamaConfig config_;
  DType dtype_;

 public:
  LlamaModel model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
