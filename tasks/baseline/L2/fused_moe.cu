#include "L2/fused_moe.h"

#include "kbn/checks.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

namespace {

// "3.w1" -> (3, "w1"); the error names the shard id.
std::pair<int64_t, std::string> parse_expert_shard(std::string_view sid, int64_t num_experts) {
  const size_t dot = sid.find('.');
  KBN_CHECK(dot != std::string_view::npos && dot > 0, "FusedMoE: shard id '", std::string(sid),
            "' is not '<expert>.w1|w2|w3'");
  int64_t e = 0;
  for (char ch : sid.substr(0, dot)) {
    KBN_CHECK(ch >= '0' && ch <= '9', "FusedMoE: shard id '", std::string(sid), "' does not start with an expert index");
    e = e * 10 + (ch - '0');
    KBN_CHECK(e < num_experts, "FusedMoE: shard id '", std::string(sid), "' names an expert outside [0, ",
              num_experts, ")");
  }
  return {e, std::string(sid.substr(dot + 1))};
}

}  // namespace

FusedMoE::FusedMoE(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
                   bool reduce_results, bool renormalize, const std::string& prefix, const ParamOptions& opts,
                   const ExpertOptions& experts)
    : num_experts_(num_experts),
      hidden_size_(hidden_size),
      intermediate_size_per_partition_(
          divide_exact(intermediate_size, parallel_state().tp_size, "FusedMoE intermediate_size")),
      reduce_results_(reduce_results),
      select_experts_(top_k, renormalize),
      fused_experts_(experts.activation, experts.swiglu_alpha, experts.swiglu_limit) {
  KBN_CHECK(num_experts > 0, "FusedMoE ", prefix, ": num_experts must be positive, got ", num_experts);
  KBN_CHECK(top_k > 0 && top_k <= num_experts, "FusedMoE ", prefix, ": top_k must be in [1, num_experts = ",
            num_experts, "], got ", top_k);
  KBN_CHECK(hidden_size > 0 && intermediate_size > 0, "FusedMoE ", prefix,
            ": hidden_size and intermediate_size must be positive, got ", hidden_size, " and ", intermediate_size);
  const int64_t n = intermediate_size_per_partition_, H = hidden_size;
  w13_weight = Tensor::empty({num_experts, 2 * n, H}, opts.dtype, opts.device);
  w2_weight = Tensor::empty({num_experts, H, n}, opts.dtype, opts.device);
  const int rank = parallel_state().tp_rank;
  const int64_t E = num_experts, full = intermediate_size;
  auto copy_into = [](Tensor dst, Tensor src) {
    if (src.dtype() != dst.dtype()) src = src.to(Device::cpu()).to(dst.dtype());
    dst.copy_(src);
  };
  // gpt-oss's fused [E, H, 2 * full] tensor (its bias: [E, 2 * full]), gate and up columns interleaved -> this rank's
  // gate columns into each expert's first n rows and its up columns into the next n, transposed to [n, H] ([n]).
  auto load_interleaved = [=](Tensor& dst, const Tensor& w, const char* what) {
    const bool bias = dst.dim() == 2;
    const int64_t rows = bias ? 1 : H;
    KBN_CHECK(w.dim() == (bias ? 2 : 3) && w.size(0) == E && w.size(-1) == 2 * full && (bias || w.size(1) == H),
              "FusedMoE: checkpoint ", what, " is ", w.str(), ", expected ",
              bias ? "[" + std::to_string(E) + ", " + std::to_string(2 * full) + "]"
                   : "[" + std::to_string(E) + ", " + std::to_string(H) + ", " + std::to_string(2 * full) + "]");
    const Tensor src = w.to(Device::cpu()).contiguous().view({E, rows, full, 2});
    for (int64_t e = 0; e < E; ++e)
      for (int half = 0; half < 2; ++half) {
        // [rows, n] of expert e's gate (half 0) or up (half 1) columns on this rank -> [n, rows]
        const Tensor part = src.select(0, e).select(2, half).slice(1, rank * n, (rank + 1) * n).transpose(0, 1);
        copy_into(dst.select(0, e).slice(0, half * n, (half + 1) * n),
                  bias ? part.contiguous().view({n}) : part.contiguous());
      }
  };
  // w1 (gate) and w3 (up) of expert e: checkpoint [intermediate_size, H], this rank's rows into the gate or up half.
  register_parameter("w13_weight", &w13_weight, InitKind::normal,
                     [=](Tensor& p, const Tensor& w, std::string_view sid) {
                       if (sid.empty()) return load_interleaved(p, w, "gate_up_proj");
                       auto [e, part] = parse_expert_shard(sid, E);
                       KBN_CHECK(part == "w1" || part == "w3", "FusedMoE: w13_weight takes parts w1 and w3, got '",
                                 std::string(sid), "'");
                       KBN_CHECK(w.dim() == 2 && w.size(0) == full && w.size(1) == H, "FusedMoE: checkpoint ", part,
                                 " of expert ", e, " is ", w.str(), ", expected [", full, ", ", H, "]");
                       const int64_t dst = part == "w1" ? 0 : n;
                       copy_into(p.select(0, e).slice(0, dst, dst + n), w.slice(0, rank * n, (rank + 1) * n));
                     });
  // w2 (down) of expert e: checkpoint [H, intermediate_size], this rank's columns.
  register_parameter("w2_weight", &w2_weight, InitKind::normal, [=](Tensor& p, const Tensor& w, std::string_view sid) {
    if (sid.empty()) {  // gpt-oss's down_proj [E, intermediate_size, H]: this rank's rows, transposed
      KBN_CHECK(w.dim() == 3 && w.size(0) == E && w.size(1) == full && w.size(2) == H, "FusedMoE: checkpoint down_proj is ",
                w.str(), ", expected [", E, ", ", full, ", ", H, "]");
      return copy_into(p, w.to(Device::cpu()).slice(1, rank * n, (rank + 1) * n).transpose(1, 2).contiguous());
    }
    auto [e, part] = parse_expert_shard(sid, E);
    KBN_CHECK(part == "w2", "FusedMoE: w2_weight takes part w2, got '", std::string(sid), "'");
    KBN_CHECK(w.dim() == 2 && w.size(0) == H && w.size(1) == full, "FusedMoE: checkpoint w2 of expert ", e, " is ",
              w.str(), ", expected [", H, ", ", full, "]");
    copy_into(p.select(0, e), w.slice(1, rank * n, (rank + 1) * n));
  });
  if (!experts.has_bias) return;
  w13_bias = Tensor::empty({num_experts, 2 * n}, opts.dtype, opts.device);
  w2_bias = Tensor::empty({num_experts, H}, opts.dtype, opts.device);
  register_parameter("w13_bias", &w13_bias, InitKind::normal, [=](Tensor& p, const Tensor& w, std::string_view sid) {
    KBN_CHECK(sid.empty(), "FusedMoE: w13_bias is loaded whole, got shard '", std::string(sid), "'");
    load_interleaved(p, w, "gate_up_proj_bias");
  });
  register_parameter("w2_bias", &w2_bias, InitKind::normal, [=](Tensor& p, const Tensor& w, std::string_view sid) {
    KBN_CHECK(sid.empty(), "FusedMoE: w2_bias is loaded whole, got shard '", std::string(sid), "'");
    KBN_CHECK(w.dim() == 2 && w.size(0) == E && w.size(1) == H, "FusedMoE: checkpoint down_proj_bias is ", w.str(),
              ", expected [", E, ", ", H, "]");
    if (rank == 0)
      copy_into(p, w);
    else
      p.zero_();  // the ranks' partial sums are all-reduced: the bias is added once
  });
}

std::string FusedMoE::gpt_oss_expert_names(const std::string& ckpt_name) {
  static const std::pair<const char*, const char*> names[] = {{".experts.gate_up_proj", ".experts.w13_weight"},
                                                              {".experts.gate_up_proj_bias", ".experts.w13_bias"},
                                                              {".experts.down_proj", ".experts.w2_weight"},
                                                              {".experts.down_proj_bias", ".experts.w2_bias"}};
  for (const auto& [from, to] : names) {
    const std::string_view f(from);
    if (ckpt_name.size() >= f.size() && ckpt_name.compare(ckpt_name.size() - f.size(), f.size(), f) == 0)
      return ckpt_name.substr(0, ckpt_name.size() - f.size()) + to;
  }
  return ckpt_name;
}

std::vector<StackedParam> FusedMoE::make_expert_params_mapping(const std::string& ckpt_gate_proj_name,
                                                               const std::string& ckpt_down_proj_name,
                                                               const std::string& ckpt_up_proj_name,
                                                               int64_t num_experts) {
  std::vector<StackedParam> m;
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::string x = ".experts." + std::to_string(e) + ".", id = std::to_string(e) + ".";
    m.push_back({".experts.w13_", x + ckpt_gate_proj_name + ".", id + "w1"});
    m.push_back({".experts.w2_", x + ckpt_down_proj_name + ".", id + "w2"});
    m.push_back({".experts.w13_", x + ckpt_up_proj_name + ".", id + "w3"});
  }
  return m;
}

Tensor FusedMoE::forward(const Tensor& hidden_states, const Tensor& router_logits) {
  check_rank(hidden_states, "FusedMoE", "hidden_states", 2, "[num_tokens, hidden_size]");
  check_size(hidden_states, "FusedMoE", "hidden_states", 1, hidden_size_, "hidden_size");
  check_rank(router_logits, "FusedMoE", "router_logits", 2, "[num_tokens, num_experts]");
  check_size(router_logits, "FusedMoE", "router_logits", 0, hidden_states.size(0), "num_tokens of hidden_states");
  check_size(router_logits, "FusedMoE", "router_logits", 1, num_experts_, "num_experts");
  auto [topk_weights, topk_ids] = select_experts_.forward(router_logits);
  return forward_routed(hidden_states, topk_weights, topk_ids);
}

Tensor FusedMoE::forward_routed(const Tensor& hidden_states, const Tensor& topk_weights, const Tensor& topk_ids,
                                const Tensor& addend) {
  check_rank(hidden_states, "FusedMoE", "hidden_states", 2, "[num_tokens, hidden_size]");
  check_size(hidden_states, "FusedMoE", "hidden_states", 1, hidden_size_, "hidden_size");
  if (addend.defined()) {
    KBN_CHECK(!(reduce_results_ && parallel_state().tp_size > 1),
              "FusedMoE: argument 'addend' cannot be added before this layer's all-reduce (reduce_results at TP ",
              parallel_state().tp_size, "): add it after");
    return fused_experts_.forward_add(addend, hidden_states, w13_weight, w2_weight, topk_weights, topk_ids, w13_bias,
                                      w2_bias);
  }
  Tensor out = fused_experts_.forward(hidden_states, w13_weight, w2_weight, topk_weights, topk_ids, w13_bias, w2_bias);
  if (reduce_results_ && parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return out;
}

}  // namespace kbn::KBN_VARIANT
