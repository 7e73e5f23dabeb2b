#include "L2/llama_attention.h"

#include <cmath>

#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

LlamaAttention::LlamaAttention(const LlamaConfig& config, int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                               double rope_theta, const RopeScaling& rope_scaling, int64_t max_position_embeddings,
                               bool bias, const std::string& prefix, const ParamOptions& opts)
    : qkv_proj(hidden_size, config.head_dim, num_heads, num_kv_heads, bias, false, opts, prefix + ".qkv_proj"),
      o_proj(num_heads * config.head_dim, hidden_size, bias, true, false, true, opts, prefix + ".o_proj"),
      rotary_emb(config.head_dim, config.head_dim, max_position_embeddings, rope_theta, true, rope_scaling, opts),
      attn(qkv_proj.num_heads(), config.head_dim, 1.0 / std::sqrt(double(config.head_dim)), qkv_proj.num_kv_heads(),
           prefix + ".attn") {
  register_module("qkv_proj", &qkv_proj);
  register_module("o_proj", &o_proj);
  register_module("attn", &attn);  // its k_scale / v_scale (fp8 KV-cache scales)
}

Tensor LlamaAttention::forward(const Tensor& positions, const Tensor& hidden_states) {
  auto [qkv, qkv_bias] = qkv_proj.forward(hidden_states);
  return forward_qkv(positions, qkv);
}

Tensor LlamaAttention::forward_qkv(const Tensor& positions, const Tensor& qkv) {
  // rotary_emb on q and k, then the paged store and attention (one fused rope + KV-store kernel where it applies).
  Tensor attn_output = attn.forward_rope(positions, qkv, rotary_emb);
  auto [output, out_bias] = o_proj.forward(attn_output);
  return output;
}

}  // namespace kbn::KBN_VARIANT
