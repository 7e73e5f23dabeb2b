#pragma once
// GptOssAttention (vLLM vllm/model_executor/models/gpt_oss.py OAIAttention; HF GptOssAttention): qkv projection with
// bias, YaRN rotary (neox), paged attention with the layer's sliding window (sliding layers only) and one learned
// sink logit per query head, scale head_dim^-1/2, output projection with bias.
#include <string>

#include "L1/rotary_embedding.h"
#include "L2/attention.h"
#include "L2/parallel_linear.h"
#include "configs/gpt_oss.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class GptOssAttention : public Module {
 public:
  // `layer_index`: which of config.sliding says whether this layer slides.
  GptOssAttention(const GptOssConfig& config, int64_t layer_index, const std::string& prefix,
                  const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& positions, const Tensor& hidden_states);
  // The same after the qkv projection: qkv [num_tokens, (num_heads + 2 num_kv_heads) * head_dim] (this rank's, bias
  // added), as qkv_proj writes it (TransformerBlock's one-token path computes it fused with the input norm:
  // rms_norm_gemv).
  Tensor forward_qkv(const Tensor& positions, const Tensor& qkv);

  bool is_sliding() const { return sliding_; }

  QKVParallelLinear qkv_proj;
  RowParallelLinear o_proj;
  RotaryEmbedding rotary_emb;
  // [num_heads / tp] f32: this rank's heads' sink logits (checkpoint `self_attn.sinks` [num_heads], bf16 in the
  // published checkpoints). Kept in f32, the dtype the attention kernels read, so no step converts them (a bf16
  // parameter cost one conversion kernel per layer per step).
  Tensor sinks;
  Attention attn;

 private:
  bool sliding_;
};

}  // namespace kbn::KBN_VARIANT
