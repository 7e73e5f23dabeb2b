#pragma once
// TransformerBlock (vLLM vllm/model_executor/models/gpt_oss.py; HF GptOssDecoderLayer): pre-norm attention and MoE
// blocks with the residual carried between layers (fused_add_rms_norm).
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/gpt_oss_attention.h"
#include "L2/mlp_block.h"
#include "configs/gpt_oss.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class TransformerBlock : public Module {
 public:
  TransformerBlock(const GptOssConfig& config, int64_t layer_index, const std::string& prefix,
                   const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or undefined for
  // the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the norms
  // work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  GptOssAttention self_attn;
  MLPBlock mlp;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  RMSNormGemv norm_qkv_;  // the one-token path: the input norm + qkv_proj
};

}  // namespace kbn::KBN_VARIANT
