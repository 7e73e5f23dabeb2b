#pragma once
// Mamba2DecoderLayer (vLLM vllm/model_executor/models/mamba2.py): a pre-norm MambaMixer2 with the residual carried
// between layers; there is no MLP. With residual_in_fp32 (Mamba-2's configs, as HF's Mamba2Block) the residual
// stream is fp32 whatever the activations' dtype: RMSNorm's fused add keeps the sum in fp32. At one token the norm is
// folded into in_proj's GEMV (rms_norm_gemv, fp32 residual included): the same bits, one kernel fewer.
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/mamba_mixer2.h"
#include "configs/mamba2.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Mamba2DecoderLayer : public Module {
 public:
  Mamba2DecoderLayer(const Mamba2Config& config, const std::string& prefix, const ParamOptions& opts);

  // hidden_states: [num_tokens, hidden_size] (the previous mixer's output, or the embeddings for the first layer);
  // residual: [num_tokens, hidden_size] (f32 with residual_in_fp32, else hidden_states' dtype), or undefined for the
  // first layer -> (this mixer's output, residual). Mutates hidden_states and residual.
  std::pair<Tensor, Tensor> forward(const Tensor& hidden_states, const Tensor& residual);

  RMSNorm norm;
  MambaMixer2 mixer;

 private:
  bool residual_in_fp32_;
  RMSNormGemv norm_in_proj_;  // norm + in_proj at one token
};

}  // namespace kbn::KBN_VARIANT
