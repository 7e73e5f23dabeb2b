#pragma once
// Gemma3DecoderLayer (vLLM gemma3.py): four GemmaRMSNorms around attention and MLP. The residual is carried between
// layers; input_layernorm and pre_feedforward_layernorm fuse the residual add, post_attention_layernorm and
// post_feedforward_layernorm normalise a block's output before it joins the residual.
#include <string>
#include <utility>

#include "L1/gemma_rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/gemma3_attention.h"
#include "L2/gemma3_mlp.h"
#include "configs/gemma3.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Gemma3DecoderLayer : public Module {
 public:
  Gemma3DecoderLayer(const Gemma3TextConfig& config, int64_t layer_index, const std::string& prefix,
                     const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or undefined for
  // the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the norms
  // work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  Gemma3Attention self_attn;
  Gemma3MLP mlp;
  GemmaRMSNorm input_layernorm;
  GemmaRMSNorm post_attention_layernorm;
  GemmaRMSNorm pre_feedforward_layernorm;
  GemmaRMSNorm post_feedforward_layernorm;

 private:
  // The one-token path: input norm + qkv_proj, pre-feedforward norm + gate_up_proj + gelu_tanh*mul.
  RMSNormGemv norm_qkv_, norm_gate_up_;
};

}  // namespace kbn::KBN_VARIANT
