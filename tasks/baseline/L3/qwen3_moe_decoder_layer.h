#pragma once
// Qwen3MoeDecoderLayer (vLLM qwen3_moe.py): Qwen3's attention (per-head q/k norms) and, by vLLM's rule
// (Qwen3MoeConfig::is_sparse_layer on the layer index taken from the prefix, "model.layers.<i>"), either the sparse
// Qwen3MoeSparseMoeBlock or the dense Qwen3MoeMLP of intermediate_size (vLLM's Qwen3MoeMLP is LlamaMLP's block),
// with the residual carried between layers (fused_add_rms_norm).
#include <memory>
#include <string>
#include <utility>

#include "L1/rms_norm.h"
#include "L1/rms_norm_gemv.h"
#include "L2/llama_mlp.h"
#include "L2/qwen3_attention.h"
#include "L2/qwen3_moe_sparse_moe_block.h"
#include "configs/qwen3_moe.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Qwen3MoeDecoderLayer : public Module {
 public:
  // prefix must end in the layer index ("model.layers.3"), as vLLM's extract_layer_index requires.
  Qwen3MoeDecoderLayer(const Qwen3MoeConfig& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size]; residual: same shape, or
  // undefined for the first layer -> (hidden_states, residual). May mutate hidden_states and residual (the
  // norms work in place from two tokens on, as vLLM's); use the returned pair.
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  int64_t layer_idx() const { return layer_idx_; }
  bool is_sparse() const { return sparse_mlp != nullptr; }

  Qwen3Attention self_attn;
  // Exactly one of the two is set; it is registered as "mlp".
  std::unique_ptr<Qwen3MoeSparseMoeBlock> sparse_mlp;
  std::unique_ptr<LlamaMLP> dense_mlp;
  RMSNorm input_layernorm;
  RMSNorm post_attention_layernorm;

 private:
  // The one-token path: norm + qkv_proj, in the dense layers norm + gate_up_proj + silu*mul, in the sparse layers
  // norm + the router (its normalised row written out for the experts).
  RMSNormGemv norm_qkv_, norm_gate_up_, norm_router_;
  int64_t layer_idx_;
};

}  // namespace kbn::KBN_VARIANT
