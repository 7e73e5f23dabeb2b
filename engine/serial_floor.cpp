#include "engine/serial_floor.h"

#include <algorithm>
#include <cmath>

#include "engine/scheduler.h"
#include "kbn/error.h"
#include "kbn/op_case.h"

namespace kbn::engine {

StepShape step_shape(const SchedulerOutput& out, int64_t window) {
  KBN_CHECK(window >= 0, "serial floor: window must be >= 0, got ", window);
  StepShape s;
  s.tokens = out.num_tokens;
  s.window = window;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSequence& e = out.seqs[i];
    const int64_t c = e.num_computed_tokens, q = e.num_new_tokens;
    // Keys the chunk's queries see under the window: from the first query's first key to the last query.
    const int64_t in_window = window > 0 ? c + q - std::max<int64_t>(0, c - window + 1) : c + q;
    if (int64_t(i) < out.num_prefills) {
      ++s.prefill_seqs;
      if (c > 0) ++s.prefill_continued;
      s.prefill_tokens += q;
      s.prefill_context += c + q;
      s.prefill_pairs += q * c + q * (q + 1) / 2;
      s.prefill_context_in_window += in_window;
      s.prefill_pairs_in_window += cases::attention_pairs(q, c, window);
    } else {
      ++s.decodes;
      s.decode_context += c + q;
      s.decode_context_in_window += in_window;
    }
    if (e.samples) ++s.logit_rows;
  }
  return s;
}

FloorModel::FloorModel(const ModelView& view, int64_t element_bytes, int64_t kv_element_bytes)
    : es_(element_bytes),
      kv_es_(kv_element_bytes > 0 ? kv_element_bytes : element_bytes),
      hidden_(view.hidden_size),
      vocab_(view.vocab_size),
      tp_(view.tp),
      layers_(view.num_layers) {
  KBN_CHECK(element_bytes > 0, "serial floor: element size must be positive, got ", element_bytes);
  KBN_CHECK(view.tp >= 1 && view.hidden_size > 0 && view.vocab_size > 0 && view.num_layers > 0,
            "serial floor: model view '", view.name, "' lacks its sizes (hidden_size, vocab_size, num_hidden_layers)");
  const int64_t H = hidden_;
  int64_t attention = 0;  // per layer: qkv [H -> (heads + 2 kv heads) x d] and o [heads x d -> H]
  if (view.attention) {
    const AttentionShape& a = *view.attention;
    attention = H * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim + a.num_heads * a.head_dim * H;
    heads_ = a.num_heads;
    head_dim_ = a.head_dim;
    kv_bytes_per_token_ = 2 * layers_ * a.num_kv_heads * a.head_dim * kv_es_;
    sliding_layers_ = a.sliding_window > 0 ? a.num_sliding_layers : 0;
    decode_pair_flops_ = prefill_pair_flops_ = 4.0 * double(a.head_dim) * double(a.num_heads);
  }
  if (view.mla) {  // q (q_proj, or q_a + q_b), kv_a_proj_with_mqa, kv_b_proj (or its absorbed halves), o_proj
    const MlaShape& a = *view.mla;
    const int64_t N = a.num_heads, q = a.qk_head_dim(), L = a.kv_lora_rank, W = a.latent_size();
    attention = (a.q_lora_rank > 0 ? H * a.q_lora_rank + a.q_lora_rank * N * q : H * N * q) + H * W +
                L * N * (a.qk_nope_head_dim + a.v_head_dim) + N * a.v_head_dim * H;
    heads_ = N;
    mla_ = true;
    kv_bytes_per_token_ = layers_ * W * kv_es_;  // one latent row per token per layer
    decode_pair_flops_ = 2.0 * double(N) * double(W + L);
    prefill_pair_flops_ = 2.0 * double(N) * double(q + a.v_head_dim);
  }
  if (view.moe) {
    const MoeShape& m = *view.moe;
    sparse_layers_ = m.num_sparse_layers;
    experts_ = m.num_experts;
    top_k_ = m.top_k;
    expert_weights_ = 3 * H * m.intermediate_size;  // w13 [2N, H] and w2 [H, N]
    router_weights_ = sparse_layers_ * H * experts_;
    router_weights_ += sparse_layers_ * 3 * H * m.shared_intermediate_size;  // DeepSeek's shared experts (dense)
  }
  int64_t mixer = 0;  // Mamba-2, per layer: in_proj [H -> I + conv_dim + heads] and out_proj [I -> H]
  if (view.mamba) {
    const MambaShape& m = *view.mamba;
    mixer = H * (m.intermediate_size + m.conv_dim() + m.num_heads) + m.intermediate_size * H;
    state_bytes_per_seq_ =
        layers_ * ((m.conv_kernel - 1) * m.conv_dim() + m.num_heads * m.head_dim * m.state_size) * es_;
    const double L = double(m.chunk_size), P = double(m.head_dim), N = double(m.state_size);
    scan_flops_per_token_ = double(layers_) * double(m.num_heads) * (2 * L * (N + P) + 4 * P * N);
    update_flops_per_token_ = double(layers_) * double(m.num_heads) * 5 * P * N;  // decay, update, read-out
  }
  const int64_t dense_mlp_layers = view.mamba ? 0 : layers_ - sparse_layers_;
  int64_t mlp = 0;
  if (dense_mlp_layers > 0) {
    KBN_CHECK(view.intermediate_size.has_value(), "serial floor: model '", view.name, "' has ", dense_mlp_layers,
              " dense MLP layers but its config gives no 'intermediate_size'");
    mlp = 3 * H * *view.intermediate_size;  // gate_up [2I, H] and down [H, I]
  }
  dense_layer_weights_ = layers_ * (attention + mixer) + dense_mlp_layers * mlp;
}

StepWork FloorModel::work(const StepShape& s) const {
  KBN_CHECK(s.tokens >= 0 && s.logit_rows >= 0 && s.logit_rows <= s.tokens && s.decode_context >= 0 &&
                s.prefill_context >= 0 && s.prefill_pairs >= 0,
            "serial floor: a step shape with negative counts or more logit rows (", s.logit_rows, ") than tokens (",
            s.tokens, ")");
  const double T = double(s.tokens), H = double(hidden_), V = double(vocab_), es = double(es_);
  StepWork w;
  const bool lm_head = s.logit_rows > 0;  // a step where no sequence samples runs no LM head
  w.lm_head_bytes = lm_head ? V * H * es : 0;
  w.lm_head_flops = 2 * double(s.logit_rows) * H * V;
  w.linear_bytes = double(dense_layer_weights_ + router_weights_) * es + w.lm_head_bytes;
  w.linear_flops = 2 * T * double(dense_layer_weights_ + router_weights_) + w.lm_head_flops;
  if (sparse_layers_ > 0 && s.tokens > 0) {
    const double E = double(experts_), k = double(top_k_);
    // NOTE: the expected number of distinct experts T tokens touch when each picks k of E uniformly (a given
    // expert is missed by one token with probability 1 - k/E); real routers are skewed and touch fewer.
    w.expected_experts = E * (1 - std::pow(1 - k / E, T));
    w.expert_bytes = double(sparse_layers_) * w.expected_experts * double(expert_weights_) * es;
    w.expert_flops = double(sparse_layers_) * 2 * T * k * double(expert_weights_);
  }
  // Each rank looks up the rows of its vocabulary shard: T / tp of them for ids spread over the shards.
  w.embedding_bytes = T / double(tp_) * H * es;
  // QK^T and PV per (query, key) pair, and K and V bytes per key, of one layer; full layers see every key, sliding
  // ones their window's (a step recorded without the window counts every key for them too: an upper bound).
  const double kv = double(kv_bytes_per_token_) / double(layers_);
  const double full = double(layers_ - sliding_layers_), sliding = double(sliding_layers_);
  auto windowed = [&](int64_t all, int64_t in_window) {
    return full * double(all) + sliding * double(s.window > 0 ? in_window : all);
  };
  w.decode_kv_bytes = kv * windowed(s.decode_context, s.decode_context_in_window);
  w.decode_flops = decode_pair_flops_ * windowed(s.decode_context, s.decode_context_in_window);
  w.prefill_kv_bytes = kv * windowed(s.prefill_context, s.prefill_context_in_window);
  w.prefill_flops = prefill_pair_flops_ * windowed(s.prefill_pairs, s.prefill_pairs_in_window);
  const double state = double(state_bytes_per_seq_);
  w.decode_state_bytes = 2 * state * double(s.decodes);
  w.decode_state_flops = update_flops_per_token_ * double(s.decodes);
  w.prefill_state_bytes = state * double(s.prefill_seqs + s.prefill_continued);
  w.prefill_state_flops = scan_flops_per_token_ * double(s.prefill_tokens);
  return w;
}

std::vector<std::string> trace_ops_of_floor_op(const std::string& op) {
  if (op == "linear") return {"linear", "rms_norm_gemv"};
  return {op};
}

double SerialFloor::op_floor_s(const std::string& op) const {
  for (const auto& o : by_op)
    if (o.op == op) return o.floor_s;
  return 0;
}

SerialFloor serial_floor(const FloorModel& model, const std::vector<StepShape>& steps, const FloorRates& rates) {
  KBN_CHECK(rates.copy_bytes_per_s > 0 && std::isfinite(rates.copy_bytes_per_s),
            "serial floor: the copy rate must be a positive number of bytes per second, got ", rates.copy_bytes_per_s);
  KBN_CHECK(rates.gemm_flop_per_s > 0 && std::isfinite(rates.gemm_flop_per_s),
            "serial floor: the GEMM rate must be a positive number of FLOPs per second, got ", rates.gemm_flop_per_s);
  const double copy = rates.copy_bytes_per_s, gemm = rates.gemm_flop_per_s;
  SerialFloor f;
  f.rates = rates;
  double linear = 0, experts = 0, embedding = 0, decode = 0, prefill = 0, state_decode = 0, state_prefill = 0;
  for (const StepShape& s : steps) {
    const StepWork w = model.work(s);
    const double bytes_s = w.weight_bytes() / copy, flops_s = w.gemm_flops() / gemm;
    ++f.steps;
    if (flops_s > bytes_s) {
      ++f.compute_bound_steps;
      f.gemm_s += flops_s;
      linear += w.linear_flops / gemm;
      experts += w.expert_flops / gemm;
    } else {
      f.gemm_s += bytes_s;
      linear += w.linear_bytes / copy;
      experts += w.expert_bytes / copy;
      embedding += w.embedding_bytes / copy;
    }
    f.kv_read_s += w.kv_bytes() / copy;
    f.attention_flops_s += w.attention_flops() / gemm;
    f.overlap_floor_s +=
        std::max((w.weight_bytes() + w.kv_bytes()) / copy, (w.gemm_flops() + w.attention_flops()) / gemm);
    decode += w.decode_kv_bytes / copy + w.decode_flops / gemm;
    prefill += w.prefill_kv_bytes / copy + w.prefill_flops / gemm;
    state_decode += w.decode_state_bytes / copy + w.decode_state_flops / gemm;
    state_prefill += w.prefill_state_bytes / copy + w.prefill_state_flops / gemm;
    f.weight_bytes += w.weight_bytes();
    f.gemm_flops += w.gemm_flops();
    f.kv_bytes += w.kv_bytes();
    f.attention_flops += w.attention_flops();
  }
  f.floor_s = f.gemm_s + f.kv_read_s + f.attention_flops_s;
  for (const auto& [op, s] : {std::pair<const char*, double>{"linear", linear},
                              {"fused_experts", experts},
                              {"embedding", embedding},
                              {model.mla() ? "mla_decode" : "flash_attn_decode", decode},
                              {"flash_attn_prefill", prefill},
                              {"selective_state_update", state_decode},
                              {"mamba_chunk_scan_combined", state_prefill}})
    if (s > 0) f.by_op.push_back({op, s});
  return f;
}

}  // namespace kbn::engine
