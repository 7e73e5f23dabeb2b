#pragma once
// The serial floor of a serving run: the least time the steps the engine actually executed could take on this GPU
// if every weight, KV and FLOP went at the rates measured at start-up, with GEMMs and attention one after the other
// (the yardstick of bench/results/h200/: "balanced 30.7 s serial: GEMMs 18.7 s + KV reads 12 s"). Per step:
//
//   GEMMs:     max(weight bytes read / copy rate, GEMM FLOPs / bf16 GEMM rate), over all linear work of the step:
//              every layer's attention projections (qkv, o) and dense MLP (gate_up, down) or MoE router gate and
//              experts, the LM head (2 x rows x H x V for the rows that sample; no rows, no LM head) and the
//              embedding (only the T rows looked up). FLOPs = 2 x T x weights of each linear for the T tokens
//              of the step (prefill chunks + decodes).
//              MoE: the expert weights read are those of the experts the step touches, counted as the expectation
//              under uniform routing, E x (1 - (1 - k/E)^T) of the E experts for T tokens at top-k k; expert FLOPs
//              2 x T x k x 3 x H x N per sparse layer (N: one expert's intermediate size).
//   attention: KV bytes read / copy rate + attention FLOPs / bf16 GEMM rate. A decode reads its whole context's K
//              and V in every layer; a prefill chunk reads its own context (cached tokens + the chunk). FLOPs are
//              4 x head_dim x num_heads per (query, key) pair per layer: ctx pairs for a decode, q x c + q(q+1)/2
//              for a chunk of q queries after c cached tokens (the causal half; c = 0 gives q(q+1)/2). A sliding
//              layer (AttentionShape::num_sliding_layers of them) reads and pairs only the keys in its window.
//   state:     (Mamba-2) every sequence of the step reads and writes its conv and SSM states in every layer (a
//              prefill chunk without earlier tokens only writes them), at the copy rate; the SSD scan's FLOPs per
//              prefill token and layer, num_heads x (2 L (N + P) + 4 P N) (a full chunk of L tokens), at the GEMM rate.
//              Counted with the attention terms (kv_read_s, attention_flops_s) and attributed to
//              "selective_state_update" (decodes) and "mamba_chunk_scan_combined" (prefill chunks).
//
// The step's floor is GEMMs + attention; the run's floor is the sum over its steps. Rates are bytes per second
// as `kb_nano kernels` counts the copy ceiling (bench::Ceilings::copy_gb_per_s) and FLOPs per second of its bf16
// GEMM ceiling. Norms, rotary, activations, the KV store, routing, sampling and collectives are not counted (a
// floor). Under tensor parallelism the shapes are one rank's (ModelView splits them as vLLM does): the ranks run
// at once, so a rank's floor is the run's.
#include <cstdint>
#include <string>
#include <vector>

#include "kbn/model_view.h"

namespace kbn::engine {

struct SchedulerOutput;

// What one engine step computed, as the scheduler laid it out (host integers, recorded for every step).
struct StepShape {
  int64_t tokens = 0;           // scheduled tokens: prefill chunks + decodes
  int64_t prefill_tokens = 0;   // of which in chunks longer than one token
  int64_t decodes = 0;          // sequences with one new token
  int64_t logit_rows = 0;       // sequences that sample this step (the LM head's rows)
  int64_t decode_context = 0;   // sum over decodes of their context (cached tokens + 1): keys read per layer
  int64_t prefill_context = 0;  // sum over prefill chunks of their context (cached tokens + chunk)
  int64_t prefill_pairs = 0;    // sum over prefill chunks of q x c + q(q+1)/2: causal (query, key) pairs
  int64_t prefill_seqs = 0;     // prefill chunks
  int64_t prefill_continued = 0;  // of which after earlier tokens of their sequence (c > 0)
  // The same three as a sliding-window layer of `window` keys reads and computes them (equal to the above without a
  // window): a decode reads min(context, window) keys, a chunk the keys its queries' windows cover.
  int64_t window = 0;
  int64_t decode_context_in_window = 0, prefill_context_in_window = 0, prefill_pairs_in_window = 0;

  bool operator==(const StepShape&) const = default;
};
// `window`: the model's sliding window (its sliding layers'), 0 without one.
StepShape step_shape(const SchedulerOutput& out, int64_t window = 0);

// Rates the floor is taken at, measured on the run's GPU.
struct FloorRates {
  double copy_bytes_per_s = 0;  // bench::Ceilings::copy_gb_per_s x 1e9
  double gemm_flop_per_s = 0;   // bench::Ceilings::bf16_tflop_per_s x 1e12
};

// One step's work split by the kb-nano op that does it.
struct StepWork {
  double linear_bytes = 0, linear_flops = 0;       // qkv, o, dense MLP, MoE router gates, LM head ("linear" op)
  double lm_head_bytes = 0, lm_head_flops = 0;     // the LM head's part of linear_*
  double expert_bytes = 0, expert_flops = 0;       // MoE experts ("fused_experts")
  double expected_experts = 0;                     // per sparse layer, uniform routing
  double embedding_bytes = 0;                      // rows looked up ("embedding")
  double decode_kv_bytes = 0, decode_flops = 0;    // "flash_attn_decode"
  double prefill_kv_bytes = 0, prefill_flops = 0;  // "flash_attn_prefill"
  double decode_state_bytes = 0, decode_state_flops = 0;    // "selective_state_update" (Mamba-2)
  double prefill_state_bytes = 0, prefill_state_flops = 0;  // "mamba_chunk_scan_combined"

  double weight_bytes() const { return linear_bytes + expert_bytes + embedding_bytes; }
  double gemm_flops() const { return linear_flops + expert_flops; }
  double kv_bytes() const { return decode_kv_bytes + prefill_kv_bytes + decode_state_bytes + prefill_state_bytes; }
  double attention_flops() const { return decode_flops + prefill_flops + decode_state_flops + prefill_state_flops; }
};

// A model's per-step work from its shapes (one rank's ModelView) and the element size of its weights and KV cache.
class FloorModel {
 public:
  // Errors name the config key the floor lacks (e.g. a dense layer without 'intermediate_size').
  // element_bytes: the weights'; kv_element_bytes: the paged cache's (fp8 pages: 1; 0: element_bytes).
  FloorModel(const ModelView& view, int64_t element_bytes, int64_t kv_element_bytes = 0);
  StepWork work(const StepShape& step) const;
  // K and V bytes of one token over every layer (the paged cache's bytes per block / block size).
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
  bool mla() const { return mla_; }  // latent attention (DeepSeek): its decode op is mla_decode
  // Elements of the dense linears of all layers: attention projections and dense MLPs (not routers or experts).
  int64_t dense_layer_weights() const { return dense_layer_weights_; }

 private:
  int64_t es_ = 2;
  int64_t kv_es_ = 2;  // bytes of a paged K/V or latent element
  int64_t hidden_ = 0, vocab_ = 0, tp_ = 1, layers_ = 0;
  int64_t dense_layer_weights_ = 0;  // attention projections + dense MLPs, summed over layers
  int64_t router_weights_ = 0;       // H x E per sparse layer (+ DeepSeek's shared experts), summed over layers
  int64_t sparse_layers_ = 0, experts_ = 0, top_k_ = 0, expert_weights_ = 0;  // expert_weights_: 3 x H x N
  int64_t heads_ = 0, head_dim_ = 0, kv_bytes_per_token_ = 0;
  // Attention FLOPs per (query, key) pair of one layer: 4 x head_dim x heads, or for MLA (DeepSeek) the absorbed
  // decode's 2 x heads x (latent + kv_lora_rank) and the decompressed prefill's 2 x heads x (qk_head_dim + v_head_dim).
  double decode_pair_flops_ = 0, prefill_pair_flops_ = 0;
  bool mla_ = false;
  int64_t sliding_layers_ = 0;  // layers that read only their window (AttentionShape::num_sliding_layers)
  int64_t state_bytes_per_seq_ = 0;  // Mamba-2: conv + SSM state of one sequence, all layers
  double scan_flops_per_token_ = 0, update_flops_per_token_ = 0;  // all layers
};

// The ops the floor is attributed to, in this order: "linear", "fused_experts", "embedding", "flash_attn_decode",
// "flash_attn_prefill", "selective_state_update", "mamba_chunk_scan_combined" (kb_nano kernels' op names, which
// --kernel-trace groups kernels by).
struct OpFloor {
  std::string op;
  double floor_s = 0;
};

struct SerialFloor {
  int64_t steps = 0;
  double floor_s = 0;               // gemm_s + kv_read_s + attention_flops_s
  double gemm_s = 0;                // sum over steps of max(weight bytes / copy rate, GEMM FLOPs / GEMM rate)
  int64_t compute_bound_steps = 0;  // steps whose GEMM term is FLOPs
  double kv_read_s = 0;             // KV bytes / copy rate
  double attention_flops_s = 0;     // attention FLOPs / GEMM rate
  double weight_bytes = 0, gemm_flops = 0, kv_bytes = 0, attention_flops = 0;  // summed over steps
  // The overlapped floor: per step max(all bytes / copy rate, all FLOPs / GEMM rate), the step's weights, KV and
  // FLOPs at both rates at once: what a schedule that overlaps memory-bound and compute-bound work perfectly
  // (overlapped nano-batches, engine/nano_batch.h) could reach at best. At most floor_s.
  double overlap_floor_s = 0;
  // Each op's share of floor_s: a step's GEMM term is split by the ops' bytes when bytes bound it, else by their
  // FLOPs; attention goes to the decode and prefill kernels. The shares sum to floor_s.
  std::vector<OpFloor> by_op;
  FloorRates rates;

  // floor_s / measured_s: 1 is the floor reached; 0 when nothing was measured.
  double achieved(double measured_s) const { return measured_s > 0 ? floor_s / measured_s : 0; }
  double overlap_achieved(double measured_s) const { return measured_s > 0 ? overlap_floor_s / measured_s : 0; }
  // The op's share, 0 when the floor attributes nothing to it.
  double op_floor_s(const std::string& op) const;
};

// The kernel-trace ops whose kernels do the work of the floor's op `op`: the op itself, and for "linear" (the
// projections) also "rms_norm_gemv", whose kernel runs a layer's one-token projections with the norm folded in. A
// floor share is compared with the seconds of all of them.
std::vector<std::string> trace_ops_of_floor_op(const std::string& op);

// Rates must be positive (the error names which is not).
SerialFloor serial_floor(const FloorModel& model, const std::vector<StepShape>& steps, const FloorRates& rates);

}  // namespace kbn::engine
