#pragma once
// Gemma3Attention (vLLM vllm/model_executor/models/gemma3.py): qkv projection, a per-head GemmaRMSNorm of q and of
// k, rotary embedding (the local base on sliding layers, the global base and scaling on full ones), paged attention
// with the layer's sliding window and scale query_pre_attn_scalar^-1/2, output projection.
#include <string>

#include "L1/gemma_rms_norm.h"
#include "L1/fused_qk_norm_rope.h"
#include "L1/rotary_embedding.h"
#include "L2/attention.h"
#include "L2/parallel_linear.h"
#include "configs/gemma3.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Gemma3Attention : public Module {
 public:
  // `layer_index`: which of config.sliding says whether this layer slides (its window and its rope).
  Gemma3Attention(const Gemma3TextConfig& config, int64_t layer_index, const std::string& prefix,
                  const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& positions, const Tensor& hidden_states);
  // The same after the qkv projection: qkv [num_tokens, (num_heads + 2 num_kv_heads) * head_dim] (this rank's), as
  // qkv_proj writes it (Gemma3DecoderLayer's one-token path computes it fused with the input norm: rms_norm_gemv).
  Tensor forward_qkv(const Tensor& positions, const Tensor& qkv);

  bool is_sliding() const { return sliding_; }

  QKVParallelLinear qkv_proj;
  RowParallelLinear o_proj;
  GemmaRMSNorm q_norm;
  GemmaRMSNorm k_norm;
  RotaryEmbedding rotary_emb;
  FusedQKNormRope qk_norm_rope;  // q_norm, k_norm and rotary_emb in one kernel where it applies (norm_rope_qkv)
  Attention attn;

 private:
  bool sliding_;
  int64_t head_dim_, num_heads_, num_kv_heads_;
};

}  // namespace kbn::KBN_VARIANT
