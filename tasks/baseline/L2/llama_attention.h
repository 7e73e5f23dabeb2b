#pragma once
// LlamaAttention (vLLM vllm/model_executor/models/llama.py): qkv projection, rotary embedding on q and
// k, paged attention, output projection. Owns its rotary embedding, as in vLLM.
#include <string>

#include "L1/rotary_embedding.h"
#include "L2/attention.h"
#include "L2/parallel_linear.h"
#include "configs/llama.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& config, int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                 double rope_theta, const RopeScaling& rope_scaling, int64_t max_position_embeddings, bool bias,
                 const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& positions, const Tensor& hidden_states);
  // The same after the qkv projection: qkv [num_tokens, (num_heads + 2 num_kv_heads) * head_dim] (this rank's), as
  // qkv_proj writes it (the decoder layers' one-token path computes it fused with the input norm: rms_norm_gemv).
  Tensor forward_qkv(const Tensor& positions, const Tensor& qkv);

  QKVParallelLinear qkv_proj;
  RowParallelLinear o_proj;
  RotaryEmbedding rotary_emb;
  Attention attn;
};

}  // namespace kbn::KBN_VARIANT
