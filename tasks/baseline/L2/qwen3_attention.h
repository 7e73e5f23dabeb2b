#pragma once
// Qwen3Attention (vLLM vllm/model_executor/models/qwen3.py): qkv projection, a per-head RMSNorm of q and of k
// (q_norm, k_norm over head_dim), rotary embedding, paged attention, output projection.
#include <string>

#include "L1/rms_norm.h"
#include "L1/fused_qk_norm_rope.h"
#include "L1/rotary_embedding.h"
#include "L2/attention.h"
#include "L2/parallel_linear.h"
#include "kbn/config.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Qwen3Attention : public Module {
 public:
  Qwen3Attention(int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads, int64_t max_position,
                 int64_t head_dim, double rms_norm_eps, bool qkv_bias, double rope_theta,
                 const RopeScaling& rope_scaling, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& positions, const Tensor& hidden_states);
  // The same after the qkv projection: qkv [num_tokens, (num_heads + 2 num_kv_heads) * head_dim] (this rank's), as
  // qkv_proj writes it (the decoder layers' one-token path computes it fused with the input norm: rms_norm_gemv).
  Tensor forward_qkv(const Tensor& positions, const Tensor& qkv);

  QKVParallelLinear qkv_proj;
  RowParallelLinear o_proj;
  RMSNorm q_norm;
  RMSNorm k_norm;
  RotaryEmbedding rotary_emb;
  FusedQKNormRope qk_norm_rope;  // q_norm, k_norm and rotary_emb in one kernel where it applies (norm_rope_qkv)
  Attention attn;

 private:
  int64_t head_dim_, num_heads_, num_kv_heads_;
};

}  // namespace kbn::KBN_VARIANT
