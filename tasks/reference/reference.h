#pragma once
// The oracle: plain CPU implementations of every Llama L1 op, written to be obviously correct rather than
// fast. Inputs may have any floating dtype and any strides; math runs in double; each output element is
// rounded to f32 and then to the output's dtype (a double rounding that can cost one 16-bit ulp, rarely). Baseline L1
// ops call these on CPU tensors, which is how the whole L1..L4 stack runs (and is tested) without a GPU.
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kbn/cache_spec.h"
#include "kbn/config.h"
#include "kbn/tensor.h"

namespace kbn::reference {

// out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight.   x, out: [num_tokens, hidden] or, normalising each
// head (Qwen3's q/k norms), [num_tokens, heads, hidden]; weight: [hidden]
void rms_norm(Tensor& out, const Tensor& x, const Tensor& weight, double eps);

// vLLM fused_add_rms_norm, in place: residual <- round(x + residual); x <- rms_norm(residual) * weight.
// x, residual: [num_tokens, hidden]; weight: [hidden]
void fused_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, double eps);

// Gemma's RMSNorm (vLLM GemmaRMSNorm): out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * (1 + weight), one
// rounding at the end. Shapes as rms_norm.
void gemma_rms_norm(Tensor& out, const Tensor& x, const Tensor& weight, double eps);

// GemmaRMSNorm with a residual, in place: residual <- round(x + residual); x <- gemma_rms_norm(residual).
// x, residual: [num_tokens, hidden]; weight: [hidden]
void gemma_fused_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, double eps);

// out[t, i] = silu(x[t, i]) * x[t, d + i], silu(a) = a / (1 + exp(-a)).   x: [num_tokens, 2d]; out: [num_tokens, d]
void silu_and_mul(Tensor& out, const Tensor& x);

// vLLM GeluAndMul: out[t, i] = gelu(x[t, i]) * x[t, d + i] with gelu(a) = a/2 (1 + erf(a / sqrt 2)) when
// approximate == "none", a/2 (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))) when "tanh".
// x: [num_tokens, 2d]; out: [num_tokens, d]
void gelu_and_mul(Tensor& out, const Tensor& x, const std::string& approximate);

// vLLM SwigluOAIAndMul (gpt-oss), interleaved: g = min(x[t, 2i], limit), u = clamp(x[t, 2i + 1], -limit, limit),
// out[t, i] = (u + 1) * g * sigmoid(alpha * g).   x: [num_tokens, 2d]; out: [num_tokens, d]
void swiglu_oai_and_mul(Tensor& out, const Tensor& x, double alpha, double limit);

// The rotary frequencies inv_freq[i] = base^(-2i/rotary_dim), i in [0, rotary_dim/2), rescaled by scaling.rope_type:
// "llama3" (wavelengths above original_max/low_freq_factor divided by factor, below original_max/high_freq_factor
// kept, smooth interpolation between), "linear" (all divided by factor), "yarn" (tasks/reference/rotary.cpp has the
// correction range and ramp). Errors name the scaling argument that is out of range.
std::vector<double> rope_inv_freq(int64_t rotary_dim, double base, const RopeScaling& scaling);

// The factor cos and sin are scaled by: YaRN's attention factor (scaling.attention_factor, or 0.1 ln(factor) + 1
// when that is 0, 1 for factor <= 1), 1 for every other rope_type.
double rope_attention_scaling(const RopeScaling& scaling);

// cos/sin table [max_position, rotary_dim] (f32): columns [0, rotary_dim/2) hold cos, the rest sin, of
// position * rope_inv_freq(...)[i], both times rope_attention_scaling(scaling).
Tensor rope_cos_sin_cache(int64_t rotary_dim, int64_t max_position, double base, const RopeScaling& scaling);

// In place rotary embedding on query [num_tokens, num_heads * head_size] and key
// [num_tokens, num_kv_heads * head_size] at positions [num_tokens] (i64). NeoX style rotates the pairs
// (i, i + rotary_dim/2); GPT-J style (is_neox = false) rotates (2i, 2i + 1). Only the first rotary_dim
// (= cos_sin_cache.size(1)) features of each head rotate.
void rotary_embedding(const Tensor& positions, Tensor& query, Tensor& key, int64_t head_size,
                      const Tensor& cos_sin_cache, bool is_neox);

// vLLM fused_qk_norm_rope (FusedQKNormRope): the q and k heads of the fused qkv rows [T, (heads + 2 kv_heads) *
// head_dim] normalised per head (rms_norm, or gemma_rms_norm when weight_offset is 1) into q_out [T, heads * head_dim]
// and k_out [T, kv_heads * head_dim], rounded to their dtype, then rotated in place by rotary_embedding, NeoX style.
void fused_qk_norm_rope(Tensor& q_out, Tensor& k_out, const Tensor& qkv, const Tensor& positions,
                        const Tensor& q_weight, const Tensor& k_weight, const Tensor& cos_sin_cache, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, double eps, double weight_offset);

// out[t, :] = weight[ids[t], :].   ids: [num_tokens] (i32 or i64), weight: [vocab, hidden]; out: [num_tokens, hidden]
// An id outside [0, vocab) is an error naming the token.
void embedding(Tensor& out, const Tensor& ids, const Tensor& weight);

// out = x @ weight^T (+ bias).   x: [num_tokens, in]; weight: [out_features, in]; bias: [out_features] or undefined
void linear(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias);

// Paged KV store (vLLM reshape_and_cache_flash): for each token t with slot s = slot_mapping[t] >= 0,
// key_cache[s / block_size, s % block_size] = key[t] (same for value); slot -1 is skipped.
// key, value: [num_tokens, num_kv_heads, head_size]; caches: [num_blocks, block_size, num_kv_heads, head_size]
// fp8 e4m3 caches with per-tensor `scales` (vLLM's k_scale / v_scale) hold float(x) / scale, rounded once; other
// caches take only scale 1.0 (check_kv_scales).
void reshape_and_cache(const Tensor& key, const Tensor& value, Tensor& key_cache, Tensor& value_cache,
                       const Tensor& slot_mapping, const KVScales& scales = {});

// Per-layer attention features, as vLLM's Attention takes them (per_layer_sliding_window, logits_soft_cap, sinks).
struct AttentionFeatures {
  int64_t sliding_window = 0;      // > 0: the query at position i sees keys i - sliding_window + 1 .. i; 0: 0 .. i
  double logits_soft_cap = 0;      // > 0: each scaled score s becomes cap * tanh(s / cap) before the softmax
  const Tensor* sinks = nullptr;   // [num_heads] (f32, f16, bf16): a logit per query head that joins the softmax
                                   // denominator and has no value (gpt-oss); nullptr: none
  KVScales kv_scales;              // fp8 pages' per-tensor scales: a key element e reads as e * k, a value as e * v
};

// Checks the sinks of AttentionFeatures against the query heads (rank 1, num_heads entries, a float dtype); the
// error names `op`. Shared by the oracle and the attention ops.
void check_attention_sinks(const char* op, const Tensor& sinks, int64_t num_heads);

// Causal varlen attention over a paged cache (prefill and chunked prefill). Sequence b owns query rows
// [query_start_loc[b], query_start_loc[b+1]) and seq_lens[b] keys (context + its new tokens, which must
// already be in the cache); query row j of b sits at position seq_lens[b] - q_len + j and sees keys
// 0..that position. GQA: query head h reads kv head h / (num_heads / num_kv_heads).
// q: [num_tokens, num_heads, head_size]; out: [num_tokens, num_heads, head_size_v], head_size_v = value_cache.size(3)
// (values may differ in width from keys; every other dimension of the caches agrees); query_start_loc: [num_seqs + 1]
// i32; seq_lens: [num_seqs] i32;
// block_tables: [num_seqs, max_blocks_per_seq] i32
// `features` narrows the keys (sliding window), caps the scores and adds sinks.
void paged_attention_prefill(Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                             const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables,
                             double scale, const AttentionFeatures& features = {});

// One query token per sequence, attending all seq_lens[b] cached keys (the last sliding_window of them with a
// window).
// q, out: [num_seqs, num_heads, head_size]
void paged_attention_decode(Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                            const Tensor& seq_lens, const Tensor& block_tables, double scale,
                            const AttentionFeatures& features = {});

// ---- multi-head latent attention (DeepSeek-V2/V3: vLLM's MLA backends, FlashMLA) ----
// The latent cache holds one row per token, kv_c_normed (kv_lora_rank) | k_pe (rope_dim): [num_blocks, block_size,
// kv_lora_rank + rope_dim]; a slot s lives in block s / block_size, row s % block_size.

// vLLM's concat_and_cache_mla: kv_cache[slot_mapping[t]] = kv_c[t] | k_pe[t] for every token with a slot >= 0 (-1:
// a padding token, skipped). kv_c: [num_tokens, kv_lora_rank]; k_pe: [num_tokens, rope_dim]; slot_mapping:
// [num_tokens] i32 or i64.
void concat_and_cache_mla(Tensor& kv_cache, const Tensor& kv_c, const Tensor& k_pe, const Tensor& slot_mapping);

// The rows of each sequence's cache pages in position order (vLLM's cp_gather_cache, with one fixed-length slot per
// sequence instead of packed rows): out[i, j] = the row of sequence i's position j for j < seq_lens[i], zeros past it.
// kv_cache: [num_blocks, block_size, width]; block_tables: [num_seqs, max_blocks_per_seq] i32; seq_lens: [num_seqs]
// i32, each at most out.size(1); out: [num_seqs, max_seq_len, width] of kv_cache's dtype.
void gather_cache(Tensor& out, const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens);

// Decode over the latent cache with the up-projections absorbed (FlashMLA's flash_mla_with_kvcache, one query per
// sequence): every query head attends all seq_lens[b] cached rows of its sequence as a single shared key head of the
// row's full width, and takes the row's first kv_lora_rank values (kv_c) as its value:
// out[b, h] = sum_p softmax_p(scale q[b, h] . row_p) row_p[:kv_lora_rank].
// q: [num_seqs, num_heads, kv_lora_rank + rope_dim]; out: [num_seqs, num_heads, kv_lora_rank].
void mla_decode(Tensor& out, const Tensor& q, const Tensor& kv_cache, const Tensor& seq_lens,
                const Tensor& block_tables, double scale);

// MLA as the model defines it (transformers' DeepseekV2Attention after its projections), the definition the absorbed
// and decompressed kernels must both meet: every cached row decompressed per head through kv_b_weight
// [num_heads * (qk_nope + v_head_dim), kv_lora_rank] (head h's rows: qk_nope key rows W_UK_h, then v_head_dim value
// rows W_UV_h): key_h = W_UK_h kv_c | k_pe, value_h = W_UV_h kv_c; then causal varlen attention over the paged
// cache as paged_attention_prefill (query row j of sequence b at position seq_lens[b] - q_len + j).
// q: [num_tokens, num_heads, qk_nope + rope_dim]; out: [num_tokens, num_heads, v_head_dim].
void mla_attention(Tensor& out, const Tensor& q, const Tensor& kv_cache, const Tensor& kv_b_weight,
                   const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables, double scale);

// out[t] = argmax_v logits[t, v] (lowest index on ties; NaN entries never win; an all-NaN row gives 0).   logits:
// [num_tokens, vocab]; out: [num_tokens] i64
void argmax(Tensor& out, const Tensor& logits);

}  // namespace kbn::reference

namespace kbn::reference {

// ---- mixture of experts (vLLM fused_moe) ----

// Router top-k: softmax over each row of gating_output [num_tokens, num_experts], the top_k experts by logit (ties:
// lower index first) best first, their probabilities (divided by the chosen ones' sum when renormalize).
// topk_weights: [num_tokens, top_k] f32; topk_ids: [num_tokens, top_k] i32. A NaN logit is an error naming it.
void topk_softmax(Tensor& topk_weights, Tensor& topk_ids, const Tensor& gating_output, bool renormalize);

// Routing near-ties (the validation's exemption, bench/validate.h). While a RoutingTieLog lives on the calling thread,
// topk_softmax records each token whose top_k-th and next logits lie within kRoutingTieUlps ulps of gating_output's
// dtype at their magnitude: a gate GEMM that rounds once differently (two ulps each way, the linear op's tolerance)
// can order those two experts either way, so two correct implementations of a block that computes its router logits
// may route the token differently. A row whose logits are all equal (an all-zero input row) is not recorded: every
// implementation computes such logits exactly and breaks the tie alike (lower index first).
constexpr int kRoutingTieUlps = 4;
class RoutingTieLog {
 public:
  RoutingTieLog();  // one per thread at a time
  ~RoutingTieLog();
  RoutingTieLog(const RoutingTieLog&) = delete;
  RoutingTieLog& operator=(const RoutingTieLog&) = delete;
  // Token rows of the routers' inputs with a near-tie, over every topk_softmax call since construction, and the most
  // rows a call routed.
  const std::set<int64_t>& rows() const { return rows_; }
  int64_t num_rows() const { return num_rows_; }
  // Used by topk_softmax.
  static RoutingTieLog* active();
  void record(int64_t row, int64_t num_rows);

 private:
  std::set<int64_t> rows_;
  int64_t num_rows_ = 0;
};

// vLLM's grouped_topk (DeepSeek-V2/V3 routers). Scores: softmax (in double) or sigmoid of each row of gating_output
// [num_tokens, num_experts]; with e_score_correction_bias ([num_experts] f32, V3's noaux_tc) the choice uses
// scores + bias while the weights stay the unbiased scores. The experts split into num_expert_group groups of
// consecutive ids; a group's score is its best score, or with the bias the sum of its two best biased scores; the
// topk_group best groups are kept and the top_k experts among them chosen (ties, of groups and of experts: lower index
// first), best first. Weights: divided by their sum when renormalize, then times routed_scaling_factor.
// topk_weights: [num_tokens, top_k] f32; topk_ids: [num_tokens, top_k] i32. A NaN logit is an error naming it.
void grouped_topk(Tensor& topk_weights, Tensor& topk_ids, const Tensor& gating_output, bool renormalize,
                  int64_t num_expert_group, int64_t topk_group, const std::string& scoring_func,
                  double routed_scaling_factor, const Tensor& e_score_correction_bias);

// moe_align_block_size (L1/moe_align_block_size.h has the layout). topk_ids: [num_tokens, top_k] i32; outputs i32
// sized by the caller: sorted_token_ids [max_padded], expert_ids [max_padded / block_size], num_tokens_post_padded [1].
void moe_align_block_size(Tensor& sorted_token_ids, Tensor& expert_ids, Tensor& num_tokens_post_padded,
                          const Tensor& topk_ids, int64_t block_size, int64_t num_experts);

// out[t, :] = sum_j input[t, j, :].   input: [num_tokens, top_k, hidden]; out: [num_tokens, hidden]
void moe_sum(Tensor& out, const Tensor& input);

// The expert activation and biases of fused_experts, as vLLM's fused_experts takes them (activation, w1_bias,
// w2_bias). swigluoai (gpt-oss) applies to the same gate and up halves as silu: with g' = min(g, limit) and
// u' = clamp(u, -limit, limit), a = (u' + 1) * g' * sigmoid(alpha * g') (gpt-oss checkpoints interleave gate and up
// columns; their loader de-interleaves them into the halves).
struct ExpertFeatures {
  enum class Activation { silu, swigluoai };
  Activation activation = Activation::silu;
  double alpha = 1.702, limit = 7.0;  // swigluoai only: alpha finite, limit positive
  const Tensor* w13_bias = nullptr;   // [E, 2 * inter] (gate, then up), added to GEMM 1 before the activation
  const Tensor* w2_bias = nullptr;    // [E, hidden], added to GEMM 2 before the routing weight
};

// Checks swigluoai's alpha and limit (finite, positive); the error names `op` and the argument.
void check_expert_activation(const char* op, const ExpertFeatures& f);
// check_expert_activation, and the biases against the experts' shapes (E, inter, hidden) and dtype; the error names
// `op` and the argument. Shared by the oracle and the op.
void check_expert_features(const char* op, const ExpertFeatures& f, int64_t num_experts, int64_t inter, int64_t hidden,
                           DType dtype);

// fused_experts (L1/fused_experts.h): per pair, h = w13[e] x + b13[e] rounded to x's dtype, a = act(h_gate, h_up)
// rounded, y = topk_weight * (w2[e] a + b2[e]) rounded, out[t] = sum_j y_j, as vLLM's caches round them.
// x: [num_tokens, hidden]; w13: [E, 2 * inter, hidden]; w2: [E, hidden, inter]; topk_weights f32 and topk_ids i32:
// [num_tokens, top_k]; out: [num_tokens, hidden]
void fused_experts(Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
                   const Tensor& topk_ids, const ExpertFeatures& features = {});

// ---- Mamba-2 (vLLM MambaMixer2's ops; issue 19). Token-major layouts: a [num_tokens, dim] tensor is vLLM's [dim,
// num_tokens] view transposed. Sequences are packed back to back, query_start_loc [num_seqs + 1] (i32) marking them.

// vLLM causal_conv1d_fn (prefill, varlen): per channel c and sequence s, over the sequence's inputs preceded by its
// width - 1 previous inputs (conv_states[cache_indices[s]] when has_initial_state[s], else zeros):
//   out[t, c] = act(bias[c] + sum_k weight[c, k] * window[t + k]),   act = silu or identity;
// then conv_states[cache_indices[s]] <- the last width - 1 inputs of that window (earlier state included when the
// sequence is shorter). x, out: [num_tokens, dim]; weight: [dim, width]; bias: [dim] or undefined;
// conv_states: [num_slots, width - 1, dim]; has_initial_state: [num_seqs] (bool or integer); cache_indices: [num_seqs]
void causal_conv1d_fn(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& conv_states,
                      const Tensor& has_initial_state, const Tensor& cache_indices, const Tensor& query_start_loc,
                      bool silu);

// vLLM causal_conv1d_update (decode): one new input per sequence; window = [conv_state, x], out = act(bias +
// weight . window), conv_state <- window[1:]. x, out: [batch, dim]; conv_states: [num_slots, width - 1, dim];
// conv_state_indices: [batch]
void causal_conv1d_update(Tensor& out, const Tensor& x, Tensor& conv_states, const Tensor& weight, const Tensor& bias,
                          const Tensor& conv_state_indices, bool silu);

// The time step of the SSM: dt' = softplus(dt + dt_bias) when dt_softplus (else dt + dt_bias), clamped to
// [dt_min, dt_max] (vLLM's dt_limit; (0, inf) is no clamp).
struct MambaTimeStep {
  bool softplus = true;
  double min = 0, max = INFINITY;
};

// vLLM mamba_chunk_scan_combined, as the recurrence it computes (chunking changes only the rounding, so the oracle
// runs the recurrence in double). Head h reads group g = h / (num_heads / n_groups) of B and C; per sequence and head,
// with the state S [head_dim, state_size] starting at initial_states[s] (when has_initial_state[s], else zero):
//   S <- exp(dt'_t A_h) S + dt'_t x_t B_t^T;   y_t = S C_t + D_h x_t.
// out[t] = y_t and final_states[s] = S after the sequence's last token.
// x, out: [num_tokens, num_heads, head_dim]; dt: [num_tokens, num_heads]; A, D, dt_bias: [num_heads] (A < 0; D and
// dt_bias may be undefined: 0); B, C: [num_tokens, n_groups, state_size]; initial_states, final_states:
// [num_seqs, num_heads, head_dim, state_size] (initial_states may be undefined when no sequence has one).
// chunk_size: the kernel's chunk (a power of two), checked only.
void mamba_chunk_scan_combined(Tensor& out, Tensor& final_states, const Tensor& x, const Tensor& dt, const Tensor& A,
                               const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                               const MambaTimeStep& step, const Tensor& initial_states,
                               const Tensor& has_initial_state, const Tensor& query_start_loc, int64_t chunk_size);

// The same scan by the chunked (SSD) algorithm the kernels use, in double: within a chunk of chunk_size tokens,
// y_t = sum_{u <= t in chunk} (C_t . B_u) exp(sum_{u < v <= t} dt'_v A) dt'_u x_u + exp(sum_{chunk start <= v <= t}
// dt'_v A) S_in C_t + D x_t, and the state leaving a chunk is exp(sum over the chunk) S_in + sum_u exp(sum_{u < v}
// dt'_v A) dt'_u x_u B_u^T. Equal to mamba_chunk_scan_combined up to rounding (tests/cpu/test_reference_mamba.cpp);
// kept as the blueprint of a GPU kernel. Arguments as mamba_chunk_scan_combined.
void ssd_chunked_scan(Tensor& out, Tensor& final_states, const Tensor& x, const Tensor& dt, const Tensor& A,
                      const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias, const MambaTimeStep& step,
                      const Tensor& initial_states, const Tensor& has_initial_state, const Tensor& query_start_loc,
                      int64_t chunk_size);

// vLLM selective_state_update (decode): one token per sequence, the state of row b at state_batch_indices[b]:
//   S <- exp(dt' A_h) S + dt' x B^T;   out = S C + D_h x.
// state: [num_slots, num_heads, head_dim, state_size] (updated); x, out: [batch, num_heads, head_dim];
// dt: [batch, num_heads]; B, C: [batch, n_groups, state_size]; A, D, dt_bias as above; state_batch_indices: [batch]
void selective_state_update(Tensor& out, Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A,
                            const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                            const MambaTimeStep& step, const Tensor& state_batch_indices);

// vLLM Mixer2RMSNormGated: y = x * silu(gate) (in f32), then each group of group_size channels is normalised by its
// own rms and scaled by weight: out = y / sqrt(mean_group(y^2) + eps) * weight.
// x, gate, out: [num_tokens, hidden]; weight: [hidden]; hidden a multiple of group_size
void rms_norm_gated(Tensor& out, const Tensor& x, const Tensor& gate, const Tensor& weight, int64_t group_size,
                    double eps);

}  // namespace kbn::reference
