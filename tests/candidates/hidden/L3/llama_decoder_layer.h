#pragma once
// Test candidate, not a kernel: a LlamaDecoderLayer whose norms are its own CPU-only module instead of
// L1/rms_norm.h's RMSNorm, so the candidate L1/rms_norm.cu of this folder is hidden from this layer.
#include <string>
#include <utility>

#include "L2/llama_attention.h"
#include "L2/llama_mlp.h"
#include "configs/llama.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

// RMSNorm on CPU through the reference oracle; same parameter name ("weight") as RMSNorm.
class InlineRMSNorm : public Module {
 public:
  InlineRMSNorm(int64_t hidden_size, double eps, const ParamOptions& opts);
  Tensor forward(const Tensor& x);
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual);

  Tensor weight;  // [hidden_size]

 private:
  double eps_;
};

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states, residual: [num_tokens, hidden_size] -> (hidden_states, residual)
  std::pair<Tensor, Tensor> forward(const Tensor& positions, const Tensor& hidden_states, const Tensor& residual);

  LlamaAttention self_attn;
  LlamaMLP mlp;
  InlineRMSNorm input_layernorm;
  InlineRMSNorm post_attention_layernorm;
};

}  // namespace kbn::KBN_VARIANT
