#pragma once
// DeepseekV2MLAAttention (vLLM vllm/model_executor/models/deepseek_v2.py, with the MLA layer of
// vllm/model_executor/layers/mla.py and its attention backend): multi-head latent attention.
//   q = q_proj(h) (q_lora_rank 0, V2-Lite) or q_b_proj(q_a_layernorm(q_a_proj(h))) (V3): [T, heads, nope | rope];
//   [kv_c | k_pe] = kv_a_proj_with_mqa(h); kv_c_normed = kv_a_layernorm(kv_c);
//   rope (GPT-J interleaved pairs; DeepSeek's YaRN) on q's rope part and on k_pe;
//   the latent row kv_c_normed | k_pe stored in the layer's paged latent cache (concat_and_cache_mla);
//   (these three, and the decode tokens' rotated q_pe into q_abs, run as one kernel: L1/fused_mla_rope_cache.h)
//   prefill tokens: their sequences' latent rows gathered (gather_cache) and decompressed through kv_b_proj into
//     per-head keys [k_nope | k_pe] and values, then causal varlen attention (FlashAttnPrefill at qk_head_dim with
//     values of v_head_dim where it runs them natively - the CPU, Hopper at 192 / 128 - else the values zero-padded
//     to qk_head_dim, as vLLM pads V for FlashAttention builds without a separate value width);
//   decode tokens: the up-projections absorbed (vLLM's W_UK_T / W_UV, made from kv_b_proj after loading):
//     q_nope @ W_UK -> [T, heads, kv_lora_rank], then mla_decode over the latent cache, then @ W_UV per head;
//   o_proj over [T, heads * v_head_dim].
// The softmax scale is qk_head_dim^-0.5 times yarn_mscale(factor, mscale_all_dim)^2 (DeepseekV2Config).
#include <memory>
#include <string>

#include "L1/bmm.h"
#include "L1/concat_and_cache_mla.h"
#include "L1/flash_attn_prefill.h"
#include "L1/fused_mla_rope_cache.h"
#include "L1/gather_cache.h"
#include "L1/mla_decode.h"
#include "L1/rms_norm.h"
#include "L1/rotary_embedding.h"
#include "L2/parallel_linear.h"
#include "L2/replicated_linear.h"
#include "configs/deepseek_v2.h"
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class DeepseekV2MLAAttention : public Module {
 public:
  // prefix: "model.layers.N.self_attn" (the layer index picks the cache).
  DeepseekV2MLAAttention(const DeepseekV2Config& config, const std::string& prefix, const ParamOptions& opts);

  // positions: [num_tokens] i64; hidden_states: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
  Tensor forward(const Tensor& positions, const Tensor& hidden_states);

  // W_UK_T / W_UV from kv_b_proj (call after loading; random-weight runs do too).
  void process_weights_after_loading() override;
  // One latent row per token, kv_lora_rank + qk_rope_head_dim wide.
  LayerCacheSpec cache_spec(DType dtype) const;

  std::unique_ptr<ColumnParallelLinear> q_proj;  // q_lora_rank == 0
  std::unique_ptr<ReplicatedLinear> q_a_proj;    // q_lora_rank > 0
  std::unique_ptr<RMSNorm> q_a_layernorm;
  std::unique_ptr<ColumnParallelLinear> q_b_proj;
  ReplicatedLinear kv_a_proj_with_mqa;
  RMSNorm kv_a_layernorm;
  ColumnParallelLinear kv_b_proj;
  RowParallelLinear o_proj;
  RotaryEmbedding rotary_emb;

  Tensor W_UK_T;  // [heads, kv_lora_rank, qk_nope_head_dim]: q_nope @ W_UK = bmm(q_nope, W_UK_T^T)
  Tensor W_UV;    // [heads, v_head_dim, kv_lora_rank]: o_latent @ W_UV^T

 private:
  // q: [T, heads, nope + rope] (its rope part not yet rotated); kv_a: kv_a_proj_with_mqa's output [T, rank + rope].
  // The norm, the rope, the latent store (one fused kernel where FusedMlaRopeCache takes the widths), then attention.
  Tensor attend(const Tensor& positions, const Tensor& q, const Tensor& kv_a);
  // 0, 1, .., n - 1 (i32): the block table of the prefill's decompressed keys (16-row pages), made anew each call.
  static Tensor block_ids(int64_t n, Device device);

  std::string prefix_;
  int64_t layer_index_, num_heads_, nope_, rope_, v_dim_, rank_;
  ConcatAndCacheMLA store_;
  GatherCache gather_;
  Bmm bmm_;
  MlaDecode decode_;
  FlashAttnPrefill prefill_;
  FusedMlaRopeCache norm_rope_store_;
};

}  // namespace kbn::KBN_VARIANT
