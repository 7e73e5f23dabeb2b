#pragma once
// One tensor-parallel rank's view of any model config: the sizes the ops of that rank see, split where vLLM
// splits them. Every op's test facts derive their cases from this view, so an op serves every family that
// uses it; parts a family lacks are absent (an attention-free model has no `attention`, a model without a
// dense MLP no `intermediate_size`) and the ops that need them produce no cases for it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kbn/config.h"

namespace kbn {

struct AttentionShape {
  int64_t num_heads = 0;     // query heads on this rank
  int64_t num_kv_heads = 0;  // kv heads on this rank (one replicated head when there are fewer than ranks)
  int64_t head_dim = 0;
  int64_t total_num_heads = 0, total_num_kv_heads = 0;
  RopeConfig rope;
  // Per-layer features some layers use: the window of the sliding layers ('sliding_window' unless
  // 'use_sliding_window' is false; 0: none), 'attn_logit_softcapping' (0: none), and a learned sink logit per
  // query head (no config key says so: set from the "attention_sinks" feature its L4 entry declares, by
  // bench::model_view; gpt-oss).
  int64_t sliding_window = 0;
  int64_t num_sliding_layers = 0;  // layers with that window: 'layer_types', else every 'sliding_window_pattern'-th
                                   // layer is full, else all layers slide
  double logits_soft_cap = 0;
  bool sinks = false;
};

// A mixture-of-experts MLP as one rank sees it: vLLM's FusedMoE splits each expert's intermediate dimension over
// the tensor-parallel ranks (every rank holds every expert).
struct MoeShape {
  int64_t num_experts = 0;
  int64_t top_k = 0;              // experts per token
  int64_t intermediate_size = 0;  // of one expert, this rank's share
  int64_t total_intermediate_size = 0;
  bool renormalize = true;  // the top-k weights divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob)
  int64_t num_sparse_layers = 0;
  // DeepSeek's router (vLLM's grouped_topk; 'n_group' or 'topk_method' in the config): scores by 'scoring_func',
  // experts in num_expert_group groups of which topk_group are kept, V3's score-correction bias ('topk_method'
  // noaux_tc), the weights times routed_scaling_factor.
  bool grouped_router = false;
  bool sigmoid_scores = false;
  int64_t num_expert_group = 1, topk_group = 1;
  bool score_correction_bias = false;
  double routed_scaling_factor = 1.0;
  // DeepSeek's shared experts ('n_shared_experts'): one dense MLP of n_shared_experts x the expert size that every
  // token of a sparse layer passes through; this rank's share (0: none).
  int64_t shared_intermediate_size = 0;
  // gpt-oss's experts: swigluoai activation (alpha, limit from 'swiglu_alpha', 'swiglu_limit') and w13/w2 biases.
  bool swigluoai = false, expert_bias = false;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
};

// A Mamba-2 mixer (vLLM MambaMixer2) as one rank sees it: heads, groups and the gated channels split over the ranks
// (a single group is replicated on every rank, as vLLM does).
struct MambaShape {
  int64_t num_heads = 0;          // this rank's
  int64_t head_dim = 0;
  int64_t state_size = 0;         // N, 'state_size'
  int64_t n_groups = 0;           // this rank's groups of B and C
  int64_t conv_kernel = 0;        // the causal conv's width
  int64_t intermediate_size = 0;  // this rank's gated channels = num_heads * head_dim
  int64_t chunk_size = 0;         // the SSD scan's chunk
  int64_t total_num_heads = 0, total_n_groups = 0;
  bool conv_bias = true;
  int64_t conv_dim() const { return intermediate_size + 2 * n_groups * state_size; }  // x, B, C
};

// Multi-head latent attention (DeepSeek-V2/V3, vLLM's DeepseekV2MLAAttention) as one rank sees it: the heads split
// over the ranks, the latent (kv_lora_rank + qk_rope_head_dim per token) whole on every rank.
struct MlaShape {
  int64_t num_heads = 0;  // this rank's
  int64_t total_num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: q_proj straight from the hidden state (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  double softmax_scale = 0;  // qk_head_dim^-0.5, times yarn_mscale(factor, mscale_all_dim)^2 under YaRN
  RopeConfig rope;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_size() const { return kv_lora_rank + qk_rope_head_dim; }  // one cached row per token
};

struct ModelView {
  std::string name;  // models/ name, "random", or the path given
  std::shared_ptr<const ModelConfig> config;
  int64_t tp = 1;
  std::string architecture;           // config.architectures[0]
  std::vector<std::string> features;  // what the architecture's L4 entry declares (e.g. "qk_norm")

  int64_t hidden_size = 0;
  int64_t vocab_size = 0;        // this rank's shard (vLLM's VocabParallelEmbedding split)
  int64_t total_vocab_size = 0;  // the sampler sees all of it
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::optional<AttentionShape> attention;
  std::optional<int64_t> intermediate_size;  // dense MLP, this rank's share (absent when every layer is MoE)
  std::optional<MoeShape> moe;
  std::optional<MambaShape> mamba;  // Mamba-2 ('state_size' with 'conv_kernel'); such a model has no dense MLP
  std::optional<MlaShape> mla;      // 'kv_lora_rank' given; such a model has no `attention` (no per-head K/V)

  bool has_feature(std::string_view f) const;

  // Reads the standard HF keys present in `config` and splits them for rank 0 of `tp`; errors name the key
  // (or --tp) and what was expected.
  static ModelView from(const std::string& name, std::shared_ptr<const ModelConfig> config, int64_t tp);
};

}  // namespace kbn
