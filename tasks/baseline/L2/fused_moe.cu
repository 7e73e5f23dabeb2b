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
                   bool reduce_results, bool renormalize, const std::string& prefix, const ParamOptions& opts)
    : num_experts_(num_experts),
      hidden_size_(hidden_size),
      intermediate_size_per_partition_(
          divide_exact(intermediate_size, parallel_state().tp_size, "FusedMoE intermediate_size")),
      reduce_results_(reduce_results),
      select_experts_(top_k, renormalize) {
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
  // w1 (gate) and w3 (up) of expert e: checkpoint [intermediate_size, H], this rank's rows into the gate or up half.
  register_parameter("w13_weight", &w13_weight, InitKind::normal,
                     [=](Tensor& p, const Tensor& w, std::string_view sid) {
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
    auto [e, part] = parse_expert_shard(sid, E);
    KBN_CHECK(part == "w2", "FusedMoE: w2_weight takes part w2, got '", std::string(sid), "'");
    KBN_CHECK(w.dim() == 2 && w.size(0) == H && w.size(1) == full, "FusedMoE: checkpoint w2 of expert ", e, " is ",
              w.str(), ", expected [", H, ", ", full, "]");
    copy_into(p.select(0, e), w.slice(1, rank * n, (rank + 1) * n));
  });
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

Tensor FusedMoE::forward_routed(const Tensor& hidden_states, const Tensor& topk_weights, const Tensor& topk_ids) {
  check_rank(hidden_states, "FusedMoE", "hidden_states", 2, "[num_tokens, hidden_size]");
  check_size(hidden_states, "FusedMoE", "hidden_states", 1, hidden_size_, "hidden_size");
  Tensor out = fused_experts_.forward(hidden_states, w13_weight, w2_weight, topk_weights, topk_ids);
  if (reduce_results_ && parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return out;
}

}  // namespace kbn::KBN_VARIANT
