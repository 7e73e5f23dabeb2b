#pragma once
// DeepseekV2Model and DeepseekV2ForCausalLM (vLLM vllm/model_executor/models/deepseek_v2.py), serving HF
// architectures "DeepseekV2ForCausalLM" and "DeepseekV3ForCausalLM": multi-head latent attention with a paged latent
// cache, a dense MLP in the first first_k_dense_replace layers and DeepSeek's MoE (routed + shared experts) after.
// Checkpoint experts `mlp.experts.{e}.gate_proj/up_proj/down_proj` stack into FusedMoE's w13/w2; dense and shared
// MLPs' `gate_proj/up_proj` into gate_up_proj. V3's multi-token-prediction layers (past num_hidden_layers) are not
// read.
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/deepseek_v2_decoder_layer.h"
#include "configs/deepseek_v2.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class DeepseekV2Model : public Module {
 public:
  DeepseekV2Model(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<DeepseekV2DecoderLayer>> layers;
  RMSNorm norm;
};

class DeepseekV2ForCausalLM : public CausalLM {
 public:
  DeepseekV2ForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const DeepseekV2Config& config() const { return config_; }

 private:
  DeepseekV2Config config_;
  DType dtype_;

 public:
  DeepseekV2Model model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
