#include "L2/gpt_oss_attention.h"

#include <cmath>

#include "kbn/error.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

namespace {

bool layer_slides(const GptOssConfig& c, int64_t layer_index) {
  KBN_CHECK(layer_index >= 0 && layer_index < int64_t(c.sliding.size()), "GptOssAttention: layer ", layer_index,
            " is outside the config's ", c.sliding.size(), " layers");
  return c.sliding[size_t(layer_index)];
}

}  // namespace

GptOssAttention::GptOssAttention(const GptOssConfig& c, int64_t layer_index, const std::string& prefix,
                                 const ParamOptions& opts)
    : qkv_proj(c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.attention_bias, false, opts,
               prefix + ".qkv_proj"),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, true, false, true, opts,
             prefix + ".o_proj"),
      rotary_emb(c.head_dim, c.head_dim, c.max_position_embeddings, c.rope_theta, true, c.rope_scaling, opts),
      sinks(Tensor::empty({qkv_proj.num_heads()}, DType::f32, opts.device)),
      attn(qkv_proj.num_heads(), c.head_dim, 1.0 / std::sqrt(double(c.head_dim)), qkv_proj.num_kv_heads(),
           prefix + ".attn", layer_slides(c, layer_index) ? c.sliding_window : 0, 0.0, &sinks),
      sliding_(layer_slides(c, layer_index)) {
  register_module("qkv_proj", &qkv_proj);
  register_module("o_proj", &o_proj);
  register_module("attn", &attn);  // its k_scale / v_scale (fp8 KV-cache scales)
  const int64_t heads = qkv_proj.num_heads(), total = c.num_attention_heads, rank = parallel_state().tp_rank;
  register_parameter("sinks", &sinks, InitKind::normal, [=](Tensor& p, const Tensor& w, std::string_view) {
    KBN_CHECK(w.dim() == 1 && w.size(0) == total, "GptOssAttention: checkpoint sinks is ", w.str(), ", expected [",
              total, "] (num_attention_heads)");
    Tensor src = w.slice(0, rank * heads, (rank + 1) * heads);
    if (src.dtype() != p.dtype()) src = src.to(Device::cpu()).to(p.dtype());
    p.copy_(src);
  });
}

Tensor GptOssAttention::forward(const Tensor& positions, const Tensor& hidden_states) {
  auto [qkv, qkv_bias] = qkv_proj.forward(hidden_states);
  return forward_qkv(positions, qkv);
}

Tensor GptOssAttention::forward_qkv(const Tensor& positions, const Tensor& qkv) {
  // rotary_emb on q and k, then the paged store and attention (one fused rope + KV-store kernel where it applies).
  Tensor attn_output = attn.forward_rope(positions, qkv, rotary_emb);
  auto [output, out_bias] = o_proj.forward(attn_output);
  return output;
}

}  // namespace kbn::KBN_VARIANT
