#pragma once
// Qwen3MoeModel and Qwen3MoeForCausalLM (vLLM vllm/model_executor/models/qwen3_moe.py), serving HF architecture
// "Qwen3MoeForCausalLM". Checkpoint experts `mlp.experts.{e}.gate_proj/up_proj/down_proj` stack into FusedMoE's
// w13/w2; dense layers' `mlp.gate_proj/up_proj` into gate_up_proj.
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/qwen3_moe_decoder_layer.h"
#include "configs/qwen3_moe.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Qwen3MoeModel : public Module {
 public:
  Qwen3MoeModel(const Qwen3MoeConfig& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<Qwen3MoeDecoderLayer>> layers;
  RMSNorm norm;
};

class Qwen3MoeForCausalLM : public CausalLM {
 public:
  Qwen3MoeForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const Qwen3MoeConfig& config() const { return config_; }

 private:
  Qwen3MoeConfig config_;
  DType dtype_;

 public:
  Qwen3MoeModel model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
