#include "L3/qwen3_moe_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or one of this layer's L2 blocks, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_llama_mlp_h) ||                     \
    defined(KBN_CANDIDATE_REPLACES_L2_llama_mlp_cu) || defined(KBN_CANDIDATE_REPLACES_L2_qwen3_attention_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_qwen3_attention_cu)
#define KBN_QWEN3_MOE_ONE_TOKEN_FUSION 0
#else
#define KBN_QWEN3_MOE_ONE_TOKEN_FUSION 1
#endif
// The sparse layers' post-attention norm + router (forward_normed) likewise stays off when a candidate replaces the
// router's linear or the sparse block.
#if KBN_QWEN3_MOE_ONE_TOKEN_FUSION && !defined(KBN_CANDIDATE_REPLACES_L2_replicated_linear_h) &&           \
    !defined(KBN_CANDIDATE_REPLACES_L2_replicated_linear_cu) &&                                              \
    !defined(KBN_CANDIDATE_REPLACES_L2_qwen3_moe_sparse_moe_block_h) &&                                      \
    !defined(KBN_CANDIDATE_REPLACES_L2_qwen3_moe_sparse_moe_block_cu)
#define KBN_QWEN3_MOE_ROUTER_FUSION 1
#else
#define KBN_QWEN3_MOE_ROUTER_FUSION 0
#endif

namespace kbn::KBN_VARIANT {

namespace {

// The layer index a prefix ends in: "model.layers.12" -> 12 (vLLM extract_layer_index); the error names the prefix.
int64_t layer_index_of(const std::string& prefix) {
  const size_t dot = prefix.rfind('.');
  const std::string tail = dot == std::string::npos ? prefix : prefix.substr(dot + 1);
  KBN_CHECK(!tail.empty() && tail.size() < 10 && tail.find_first_not_of("0123456789") == std::string::npos,
            "Qwen3MoeDecoderLayer: prefix '", prefix, "' does not end in a layer index (\"model.layers.<i>\")");
  return std::stoll(tail);
}

}  // namespace

Qwen3MoeDecoderLayer::Qwen3MoeDecoderLayer(const Qwen3MoeConfig& config, const std::string& prefix,
                                           const ParamOptions& opts)
    : self_attn(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                config.max_position_embeddings, config.head_dim, config.rms_norm_eps, config.attention_bias,
                config.rope_theta, config.rope_scaling, prefix + ".self_attn", opts),
      input_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, opts),
      norm_qkv_(config.rms_norm_eps),
      norm_gate_up_(config.rms_norm_eps, 0.0, NormGemvAct::silu_and_mul),
      norm_router_(config.rms_norm_eps),
      layer_idx_(layer_index_of(prefix)) {
  register_module("self_attn", &self_attn);
  if (config.is_sparse_layer(layer_idx_)) {
    sparse_mlp = std::make_unique<Qwen3MoeSparseMoeBlock>(config, prefix + ".mlp", opts);
    register_module("mlp", sparse_mlp.get());
  } else {
    dense_mlp = std::make_unique<LlamaMLP>(config.hidden_size, config.intermediate_size, config.hidden_act, false,
                                           prefix + ".mlp", opts);
    register_module("mlp", dense_mlp.get());
  }
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::pair<Tensor, Tensor> Qwen3MoeDecoderLayer::forward(const Tensor& positions, const Tensor& hidden_states,
                                                        const Tensor& residual) {
#if KBN_QWEN3_MOE_ONE_TOKEN_FUSION
  // One token: the input norm folded into qkv_proj, and in the dense layers the post-attention norm into gate_up_proj
  // and silu*mul, in the sparse layers into the router (rms_norm_gemv; the same bits).
  if (RMSNormGemv::applies(hidden_states)) {
    auto [qkv, res] = norm_qkv_.forward(hidden_states, residual, input_layernorm.weight, self_attn.qkv_proj.weight,
                                        self_attn.qkv_proj.bias);
    if (!residual.defined()) res = hidden_states;
    Tensor h = self_attn.forward_qkv(positions, qkv);
    if (dense_mlp) {
      auto [act, res_mlp] = norm_gate_up_.forward(h, res, post_attention_layernorm.weight,
                                                  dense_mlp->gate_up_proj.weight, dense_mlp->gate_up_proj.bias);
      return {dense_mlp->forward_act(act), res_mlp};
    }
#if KBN_QWEN3_MOE_ROUTER_FUSION
    // The sparse layers: the post-attention norm folded into the router's GEMV, the normalised row written out once
    // for the experts (forward_normed; the same bits as the norm then the gate's linear).
    auto [logits, res_moe, y] = norm_router_.forward_normed(h, res, post_attention_layernorm.weight,
                                                            sparse_mlp->gate.weight, sparse_mlp->gate.bias);
    return {sparse_mlp->forward_with_logits(y, logits), res_moe};
#else
    std::tie(h, res) = post_attention_layernorm.forward(h, res);
    return {sparse_mlp->forward(h), res};
#endif
  }
#endif
  Tensor h, res;
  if (!residual.defined()) {
    res = hidden_states;
    h = input_layernorm.forward(hidden_states);
  } else {
    std::tie(h, res) = input_layernorm.forward(hidden_states, residual);
  }
  h = self_attn.forward(positions, h);
  std::tie(h, res) = post_attention_layernorm.forward(h, res);
  h = sparse_mlp ? sparse_mlp->forward(h) : dense_mlp->forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
