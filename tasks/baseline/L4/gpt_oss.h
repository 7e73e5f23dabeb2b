#pragma once
// GptOssModel and GptOssForCausalLM (vLLM vllm/model_executor/models/gpt_oss.py), serving HF architecture
// "GptOssForCausalLM" in the activation dtype (bf16): the published checkpoints' MXFP4 expert tensors
// (`*_blocks`, `*_scales`) are not read; a bf16 checkpoint (HF names `experts.gate_up_proj`, `gate_up_proj_bias`,
// `down_proj`, `down_proj_bias`; FusedMoE::gpt_oss_expert_names) is. The embedding keeps HF's name embed_tokens.
#include <memory>
#include <string>
#include <vector>

#include "L1/rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/transformer_block.h"
#include "configs/gpt_oss.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GptOssModel : public Module {
 public:
  GptOssModel(const GptOssConfig& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<TransformerBlock>> layers;
  RMSNorm norm;
};

class GptOssForCausalLM : public CausalLM {
 public:
  GptOssForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  // One paged K/V per layer, the sliding layers' with the config's window.
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const GptOssConfig& config() const { return config_; }

 private:
  GptOssConfig config_;
  DType dtype_;

 public:
  GptOssModel model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
