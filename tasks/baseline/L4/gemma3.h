#pragma once
// Gemma3Model and Gemma3ForCausalLM (vLLM vllm/model_executor/models/gemma3.py), serving HF architecture
// "Gemma3ForCausalLM" (the Gemma-3 text models): embeddings scaled by sqrt(hidden_size), five sliding-window layers
// for each full one (config.sliding), GemmaRMSNorm everywhere, the LM head tied to the embeddings. It also serves the
// text model of "Gemma3ForConditionalGeneration" (the published 4B-27B checkpoints): the config's text_config, the
// checkpoint's language-model tensors (`language_model.model.*`, or `model.language_model.*` as transformers 5
// saves them), the vision tower and projector skipped.
#include <memory>
#include <string>
#include <vector>

#include "L1/gemma_rms_norm.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/gemma3_decoder_layer.h"
#include "configs/gemma3.h"
#include "kbn/causal_lm.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Gemma3Model : public Module {
 public:
  Gemma3Model(const Gemma3TextConfig& config, const std::string& prefix, const ParamOptions& opts);

  // input_ids, positions: [num_tokens] i64 -> final-normed hidden states [num_tokens, hidden_size]
  Tensor forward(const Tensor& input_ids, const Tensor& positions);

  VocabParallelEmbedding embed_tokens;
  std::vector<std::unique_ptr<Gemma3DecoderLayer>> layers;
  GemmaRMSNorm norm;

 private:
  double normalizer_;  // sqrt(hidden_size)
};

class Gemma3ForCausalLM : public CausalLM {
 public:
  Gemma3ForCausalLM(const ModelConfig& config, const ParamOptions& opts);

  Tensor forward(const Tensor& input_ids, const Tensor& positions) override;
  Tensor compute_logits(const Tensor& hidden_states) override;
  void load_weights(const WeightSource& weights) override;
  // Sliding layers declare their window (kbn/cache_spec.h).
  std::vector<LayerCacheSpec> cache_specs() const override;
  int64_t vocab_size() const override { return config_.vocab_size; }

  const Gemma3TextConfig& config() const { return config_; }

 private:
  Gemma3TextConfig config_;
  DType dtype_;

 public:
  Gemma3Model model;
  ParallelLMHead lm_head;
};

}  // namespace kbn::KBN_VARIANT
