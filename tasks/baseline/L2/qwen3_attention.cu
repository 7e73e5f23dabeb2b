#include "L2/qwen3_attention.h"

#include <cmath>

namespace kbn::KBN_VARIANT {

Qwen3Attention::Qwen3Attention(int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads, int64_t max_position,
                               int64_t head_dim, double rms_norm_eps, bool qkv_bias, double rope_theta,
                               const RopeScaling& rope_scaling, const std::string& prefix, const ParamOptions& opts)
    : qkv_proj(hidden_size, head_dim, num_heads, num_kv_heads, qkv_bias, false, opts, prefix + ".qkv_proj"),
      o_proj(num_heads * head_dim, hidden_size, false, true, false, true, opts, prefix + ".o_proj"),
      q_norm(head_dim, rms_norm_eps, opts),
      k_norm(head_dim, rms_norm_eps, opts),
      rotary_emb(head_dim, head_dim, max_position, rope_theta, true, rope_scaling, opts),
      qk_norm_rope(qkv_proj.num_heads(), qkv_proj.num_kv_heads(), head_dim, rms_norm_eps, 0.0),
      attn(qkv_proj.num_heads(), head_dim, 1.0 / std::sqrt(double(head_dim)), qkv_proj.num_kv_heads(),
           prefix + ".attn"),
      head_dim_(head_dim),
      num_heads_(qkv_proj.num_heads()),
      num_kv_heads_(qkv_proj.num_kv_heads()) {
  register_module("qkv_proj", &qkv_proj);
  register_module("o_proj", &o_proj);
  register_module("attn", &attn);  // its k_scale / v_scale (fp8 KV-cache scales)
  register_module("q_norm", &q_norm);
  register_module("k_norm", &k_norm);
}

Tensor Qwen3Attention::forward(const Tensor& positions, const Tensor& hidden_states) {
  auto [qkv, qkv_bias] = qkv_proj.forward(hidden_states);
  return forward_qkv(positions, qkv);
}

Tensor Qwen3Attention::forward_qkv(const Tensor& positions, const Tensor& qkv) {
#if KBN_QK_NORM_ROPE_STORE_FUSION
  Tensor attn_output = attn.forward_qk_norm_rope(positions, qkv, q_norm, k_norm, rotary_emb, qk_norm_rope);
#else
  const NormedQKV x = norm_rope_qkv(qkv, positions, num_heads_, num_kv_heads_, head_dim_, q_norm, k_norm, rotary_emb,
                                     qk_norm_rope);
  Tensor attn_output = attn.forward(x.q, x.k, x.v);
#endif
  auto [output, out_bias] = o_proj.forward(attn_output);
  return output;
}

}  // namespace kbn::KBN_VARIANT
