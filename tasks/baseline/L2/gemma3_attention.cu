#include "L2/gemma3_attention.h"

#include <cmath>

#include "kbn/error.h"

namespace kbn::KBN_VARIANT {

namespace {

bool layer_slides(const Gemma3TextConfig& c, int64_t layer_index) {
  KBN_CHECK(layer_index >= 0 && layer_index < int64_t(c.sliding.size()), "Gemma3Attention: layer ", layer_index,
            " is outside the config's ", c.sliding.size(), " layers");
  return c.sliding[size_t(layer_index)];
}

}  // namespace

Gemma3Attention::Gemma3Attention(const Gemma3TextConfig& c, int64_t layer_index, const std::string& prefix,
                                 const ParamOptions& opts)
    : qkv_proj(c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.attention_bias, false, opts,
               prefix + ".qkv_proj"),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, true, false, true, opts,
             prefix + ".o_proj"),
      q_norm(c.head_dim, c.rms_norm_eps, opts),
      k_norm(c.head_dim, c.rms_norm_eps, opts),
      rotary_emb(c.head_dim, c.head_dim, c.max_position_embeddings,
                 layer_slides(c, layer_index) ? c.rope_local.theta : c.rope_global.theta, true,
                 layer_slides(c, layer_index) ? c.rope_local.scaling : c.rope_global.scaling, opts),
      qk_norm_rope(qkv_proj.num_heads(), qkv_proj.num_kv_heads(), c.head_dim, c.rms_norm_eps, 1.0),
      attn(qkv_proj.num_heads(), c.head_dim, 1.0 / std::sqrt(c.query_pre_attn_scalar), qkv_proj.num_kv_heads(),
           prefix + ".attn", layer_slides(c, layer_index) ? c.sliding_window : 0, c.attn_logit_softcapping),
      sliding_(layer_slides(c, layer_index)),
      head_dim_(c.head_dim),
      num_heads_(qkv_proj.num_heads()),
      num_kv_heads_(qkv_proj.num_kv_heads()) {
  register_module("qkv_proj", &qkv_proj);
  register_module("o_proj", &o_proj);
  register_module("attn", &attn);  // its k_scale / v_scale (fp8 KV-cache scales)
  register_module("q_norm", &q_norm);
  register_module("k_norm", &k_norm);
}

Tensor Gemma3Attention::forward(const Tensor& positions, const Tensor& hidden_states) {
  auto [qkv, qkv_bias] = qkv_proj.forward(hidden_states);
  return forward_qkv(positions, qkv);
}

Tensor Gemma3Attention::forward_qkv(const Tensor& positions, const Tensor& qkv) {
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
