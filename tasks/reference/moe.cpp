// Oracle: the mixture-of-experts ops (vLLM fused_moe.py): router top-k (plain and grouped), per-expert alignment,
// the expert MLPs and the per-token sum.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kbn/checks.h"
#include "kbn/parallel.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

double silu(double a) { return a / (1.0 + std::exp(-a)); }

// Values rounded to `dtype` (through f32), as a kernel storing them in that dtype would.
std::vector<double> rounded(const std::vector<double>& v, DType dtype) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_floats(f, {int64_t(f.size())}, dtype).to_doubles();
}

void check_ids(const Tensor& topk_ids, const char* op, int64_t num_experts) {
  check_rank(topk_ids, op, "topk_ids", 2, "[num_tokens, top_k]");
  check_dtype(topk_ids, op, "topk_ids", {DType::i32});
  check_cpu(topk_ids, op, "topk_ids");
  const auto ids = topk_ids.to_ints();
  for (size_t p = 0; p < ids.size(); ++p)
    KBN_CHECK(ids[p] >= 0 && ids[p] < num_experts, op, ": topk_ids[", int64_t(p) / topk_ids.size(1), ", ",
              int64_t(p) % topk_ids.size(1), "] = ", ids[p], " is not an expert in [0, ", num_experts, ")");
}

}  // namespace

namespace {

thread_local RoutingTieLog* tls_tie_log = nullptr;

// The spacing of `dtype`'s values at |x| (its unit in the last place).
double ulp_of(double x, DType dtype) {
  const int digits = dtype == DType::bf16 ? 8 : dtype == DType::f16 ? 11 : 24;  // significand bits
  int e = 0;
  (void)std::frexp(std::max(std::abs(x), 1e-30), &e);  // |x| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - digits);
}

}  // namespace

RoutingTieLog::RoutingTieLog() {
  KBN_CHECK(tls_tie_log == nullptr, "reference::RoutingTieLog: one per thread at a time");
  tls_tie_log = this;
}

RoutingTieLog::~RoutingTieLog() { tls_tie_log = nullptr; }

RoutingTieLog* RoutingTieLog::active() { return tls_tie_log; }

void RoutingTieLog::record(int64_t row, int64_t num_rows) {
  rows_.insert(row);
  num_rows_ = std::max(num_rows_, num_rows);
}

void topk_softmax(Tensor& topk_weights, Tensor& topk_ids, const Tensor& gating_output, bool renormalize) {
  constexpr const char* kOp = "reference::topk_softmax";
  check_rank(gating_output, kOp, "gating_output", 2, "[num_tokens, num_experts]");
  check_dtype(gating_output, kOp, "gating_output", {DType::f32, DType::f16, DType::bf16});
  check_cpu(gating_output, kOp, "gating_output");
  const int64_t n = gating_output.size(0), e = gating_output.size(1), k = topk_ids.size(-1);
  KBN_CHECK(k >= 1 && k <= e, kOp, ": top_k must be in [1, num_experts = ", e, "], got ", k);
  check_rank(topk_weights, kOp, "topk_weights", 2, "[num_tokens, top_k]");
  check_dtype(topk_weights, kOp, "topk_weights", {DType::f32});
  check_size(topk_weights, kOp, "topk_weights", 0, n, "num_tokens");
  check_size(topk_weights, kOp, "topk_weights", 1, k, "top_k");
  check_rank(topk_ids, kOp, "topk_ids", 2, "[num_tokens, top_k]");
  check_dtype(topk_ids, kOp, "topk_ids", {DType::i32});
  check_size(topk_ids, kOp, "topk_ids", 0, n, "num_tokens");

  const std::vector<double> g = gating_output.to_doubles();
  std::vector<float> w(size_t(n * k));
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<int64_t> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    const double* row = g.data() + t * e;
    for (int64_t x = 0; x < e; ++x)
      KBN_CHECK(!std::isnan(row[x]), kOp, ": gating_output[", t, ", ", x, "] is NaN (router logits must be numbers)");
    const double mx = *std::max_element(row, row + e);
    double sum = 0;
    for (int64_t x = 0; x < e; ++x) sum += std::exp(row[x] - mx);
    std::iota(order.begin(), order.end(), 0);
    // Best logit first; equal logits: lower expert first.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    if (RoutingTieLog* log = RoutingTieLog::active(); log && k < e) {
      const double last = row[order[size_t(k - 1)]], next = row[order[size_t(k)]];
      const bool all_equal = std::all_of(row, row + e, [&](double v) { return v == row[0]; });
      if (!all_equal &&
          last - next <= kRoutingTieUlps * ulp_of(std::max(std::abs(last), std::abs(next)), gating_output.dtype()))
        log->record(t, n);
    }
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += std::exp(row[order[size_t(j)]] - mx) / sum;
    for (int64_t j = 0; j < k; ++j) {
      const double p = std::exp(row[order[size_t(j)]] - mx) / sum;
      w[size_t(t * k + j)] = float(renormalize ? p / chosen : p);
      ids[size_t(t * k + j)] = int32_t(order[size_t(j)]);
    }
  }
  topk_weights.copy_(Tensor::from_floats(w, {n, k}, DType::f32));
  topk_ids.copy_(Tensor::from_i32(ids, {n, k}));
}

void grouped_topk(Tensor& topk_weights, Tensor& topk_ids, const Tensor& gating_output, bool renormalize,
                  int64_t num_expert_group, int64_t topk_group, const std::string& scoring_func,
                  double routed_scaling_factor, const Tensor& e_score_correction_bias) {
  constexpr const char* kOp = "reference::grouped_topk";
  check_rank(gating_output, kOp, "gating_output", 2, "[num_tokens, num_experts]");
  check_dtype(gating_output, kOp, "gating_output", {DType::f32, DType::f16, DType::bf16});
  check_cpu(gating_output, kOp, "gating_output");
  const int64_t n = gating_output.size(0), e = gating_output.size(1), k = topk_ids.size(-1);
  KBN_CHECK(scoring_func == "softmax" || scoring_func == "sigmoid", kOp,
            ": argument 'scoring_func' must be softmax or sigmoid, got '", scoring_func, "'");
  KBN_CHECK(num_expert_group >= 1 && e % num_expert_group == 0, kOp, ": argument 'num_expert_group' (",
            num_expert_group, ") must divide num_experts (", e, ", gating_output ", gating_output.str(), ")");
  const int64_t per_group = e / num_expert_group;
  KBN_CHECK(topk_group >= 1 && topk_group <= num_expert_group, kOp, ": argument 'topk_group' (", topk_group,
            ") must be in [1, num_expert_group = ", num_expert_group, "]");
  KBN_CHECK(k >= 1 && k <= topk_group * per_group, kOp, ": top_k (", k, ", topk_ids' last dimension) must be in [1, ",
            topk_group * per_group, "]: the experts of topk_group groups");
  KBN_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0, kOp,
            ": argument 'routed_scaling_factor' must be positive, got ", routed_scaling_factor);
  check_rank(topk_weights, kOp, "topk_weights", 2, "[num_tokens, top_k]");
  check_dtype(topk_weights, kOp, "topk_weights", {DType::f32});
  check_size(topk_weights, kOp, "topk_weights", 0, n, "num_tokens");
  check_size(topk_weights, kOp, "topk_weights", 1, k, "top_k");
  check_rank(topk_ids, kOp, "topk_ids", 2, "[num_tokens, top_k]");
  check_dtype(topk_ids, kOp, "topk_ids", {DType::i32});
  check_size(topk_ids, kOp, "topk_ids", 0, n, "num_tokens");
  const bool biased = e_score_correction_bias.defined();
  std::vector<double> bias(static_cast<size_t>(e), 0.0);
  if (biased) {
    check_rank(e_score_correction_bias, kOp, "e_score_correction_bias", 1, "[num_experts]");
    check_size(e_score_correction_bias, kOp, "e_score_correction_bias", 0, e, "num_experts");
    check_cpu(e_score_correction_bias, kOp, "e_score_correction_bias");
    KBN_CHECK(per_group >= 2, kOp, ": with 'e_score_correction_bias' a group is scored by its two best experts, but ",
              num_expert_group, " groups of ", e, " experts hold ", per_group);
    bias = e_score_correction_bias.to_doubles();
  }

  const std::vector<double> g = gating_output.to_doubles();
  std::vector<float> w(size_t(n * k));
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<double> scores(static_cast<size_t>(e)), choice(static_cast<size_t>(e)),
      group_score(static_cast<size_t>(num_expert_group));
  std::vector<int64_t> groups(static_cast<size_t>(num_expert_group)), experts;
  for (int64_t t = 0; t < n; ++t) {
    const double* row = g.data() + t * e;
    for (int64_t x = 0; x < e; ++x)
      KBN_CHECK(!std::isnan(row[x]), kOp, ": gating_output[", t, ", ", x, "] is NaN (router logits must be numbers)");
    if (scoring_func == "softmax") {
      const double mx = *std::max_element(row, row + e);
      double sum = 0;
      for (int64_t x = 0; x < e; ++x) sum += (scores[size_t(x)] = std::exp(row[x] - mx));
      for (double& s : scores) s /= sum;
    } else {
      for (int64_t x = 0; x < e; ++x) scores[size_t(x)] = 1.0 / (1.0 + std::exp(-row[x]));
    }
    for (int64_t x = 0; x < e; ++x) choice[size_t(x)] = scores[size_t(x)] + bias[size_t(x)];
    for (int64_t gi = 0; gi < num_expert_group; ++gi) {
      std::vector<double> member(choice.begin() + gi * per_group, choice.begin() + (gi + 1) * per_group);
      std::sort(member.begin(), member.end(), std::greater<double>());
      group_score[size_t(gi)] = biased ? member[0] + member[1] : member[0];
    }
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int64_t a, int64_t b) { return group_score[size_t(a)] > group_score[size_t(b)]; });
    experts.clear();
    for (int64_t j = 0; j < topk_group; ++j)
      for (int64_t x = 0; x < per_group; ++x) experts.push_back(groups[size_t(j)] * per_group + x);
    std::sort(experts.begin(), experts.end());
    std::stable_sort(experts.begin(), experts.end(),
                     [&](int64_t a, int64_t b) { return choice[size_t(a)] > choice[size_t(b)]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += scores[size_t(experts[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const double p = scores[size_t(experts[size_t(j)])];
      w[size_t(t * k + j)] = float((renormalize ? p / chosen : p) * routed_scaling_factor);
      ids[size_t(t * k + j)] = int32_t(experts[size_t(j)]);
    }
  }
  topk_weights.copy_(Tensor::from_floats(w, {n, k}, DType::f32));
  topk_ids.copy_(Tensor::from_i32(ids, {n, k}));
}

void moe_align_block_size(Tensor& sorted_token_ids, Tensor& expert_ids, Tensor& num_tokens_post_padded,
                          const Tensor& topk_ids, int64_t block_size, int64_t num_experts) {
  constexpr const char* kOp = "reference::moe_align_block_size";
  KBN_CHECK(block_size >= 1, kOp, ": block_size must be positive, got ", block_size);
  KBN_CHECK(num_experts >= 1, kOp, ": num_experts must be positive, got ", num_experts);
  check_ids(topk_ids, kOp, num_experts);
  const int64_t pairs = topk_ids.numel();
  const int64_t max_padded = sorted_token_ids.numel(), blocks = expert_ids.numel();
  KBN_CHECK(max_padded % block_size == 0 && blocks == max_padded / block_size, kOp, ": sorted_token_ids [", max_padded,
            "] and expert_ids [", blocks, "] disagree with block_size ", block_size);
  const auto ids = topk_ids.to_ints();
  std::vector<int32_t> sorted(static_cast<size_t>(max_padded), int32_t(pairs)),
      experts(static_cast<size_t>(blocks), int32_t(num_experts));
  int64_t pos = 0;
  for (int64_t x = 0; x < num_experts; ++x) {
    const int64_t start = pos;
    for (int64_t p = 0; p < pairs; ++p)
      if (ids[size_t(p)] == x) sorted[size_t(pos++)] = int32_t(p);
    pos = start + (pos - start + block_size - 1) / block_size * block_size;
    KBN_CHECK(pos <= max_padded, kOp, ": sorted_token_ids [", max_padded, "] is too small for the padded pairs");
    for (int64_t b = start / block_size; b < pos / block_size; ++b) experts[size_t(b)] = int32_t(x);
  }
  sorted_token_ids.copy_(Tensor::from_i32(sorted, {max_padded}));
  expert_ids.copy_(Tensor::from_i32(experts, {blocks}));
  num_tokens_post_padded.copy_(Tensor::from_i32({int32_t(pos)}, {1}));
}

void moe_sum(Tensor& out, const Tensor& input) {
  constexpr const char* kOp = "reference::moe_sum";
  check_rank(input, kOp, "input", 3, "[num_tokens, top_k, hidden]");
  check_dtype(input, kOp, "input", {DType::f32, DType::f16, DType::bf16});
  check_cpu(input, kOp, "input");
  const int64_t n = input.size(0), k = input.size(1), h = input.size(2);
  check_rank(out, kOp, "out", 2, "[num_tokens, hidden]");
  check_size(out, kOp, "out", 0, n, "num_tokens");
  check_size(out, kOp, "out", 1, h, "hidden");
  const std::vector<double> x = input.to_doubles();
  std::vector<float> o(size_t(n * h));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < h; ++i) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += x[size_t((t * k + j) * h + i)];
      o[size_t(t * h + i)] = float(s);
    }
  out.copy_(Tensor::from_floats(o, {n, h}, DType::f32));
}

void check_expert_activation(const char* op, const ExpertFeatures& f) {
  if (f.activation != ExpertFeatures::Activation::swigluoai) return;
  KBN_CHECK(std::isfinite(f.alpha), op, ": argument 'alpha' (swigluoai) must be finite, got ", f.alpha);
  KBN_CHECK(f.limit > 0, op, ": argument 'limit' (swigluoai) must be positive, got ", f.limit);
}

void check_expert_features(const char* op, const ExpertFeatures& f, int64_t num_experts, int64_t inter, int64_t hidden,
                           DType dtype) {
  check_expert_activation(op, f);
  const std::pair<const char*, const Tensor*> biases[] = {{"w13_bias", f.w13_bias}, {"w2_bias", f.w2_bias}};
  for (const auto& [name, b] : biases) {
    if (!b) continue;
    const int64_t cols = b == f.w13_bias ? 2 * inter : hidden;
    const char* want = b == f.w13_bias ? "[num_experts, 2 * inter]" : "[num_experts, hidden]";
    check_rank(*b, op, name, 2, want);
    check_size(*b, op, name, 0, num_experts, "num_experts");
    check_size(*b, op, name, 1, cols, b == f.w13_bias ? "2 * inter" : "hidden");
    KBN_CHECK(b->dtype() == dtype, op, ": argument '", name, "' must have the experts' dtype ", dtype_name(dtype),
              ", got ", dtype_name(b->dtype()));
  }
}

void fused_experts(Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_weights,
                   const Tensor& topk_ids, const ExpertFeatures& features) {
  constexpr const char* kOp = "reference::fused_experts";
  check_rank(x, kOp, "hidden_states", 2, "[num_tokens, hidden]");
  check_dtype(x, kOp, "hidden_states", {DType::f32, DType::f16, DType::bf16});
  check_rank(w13, kOp, "w13", 3, "[num_experts, 2 * inter, hidden]");
  check_rank(w2, kOp, "w2", 3, "[num_experts, hidden, inter]");
  const int64_t n = x.size(0), h = x.size(1), e = w13.size(0), inter = w13.size(1) / 2;
  KBN_CHECK(w13.size(1) % 2 == 0, kOp, ": w13 [num_experts, 2 * inter, hidden] needs an even dim 1, got ", w13.str());
  check_size(w13, kOp, "w13", 2, h, "hidden");
  check_size(w2, kOp, "w2", 0, e, "num_experts");
  check_size(w2, kOp, "w2", 1, h, "hidden");
  check_size(w2, kOp, "w2", 2, inter, "inter");
  check_ids(topk_ids, kOp, e);
  check_size(topk_ids, kOp, "topk_ids", 0, n, "num_tokens");
  const int64_t k = topk_ids.size(1);
  check_rank(topk_weights, kOp, "topk_weights", 2, "[num_tokens, top_k]");
  check_size(topk_weights, kOp, "topk_weights", 0, n, "num_tokens");
  check_size(topk_weights, kOp, "topk_weights", 1, k, "top_k");
  const DType dt = x.dtype();
  check_expert_features(kOp, features, e, inter, h, dt);
  const bool oai = features.activation == ExpertFeatures::Activation::swigluoai;
  const double alpha = features.alpha, limit = features.limit;
  auto activation = [&](double g, double u) {
    if (!oai) return silu(g) * u;
    g = std::min(g, limit), u = std::clamp(u, -limit, limit);
    return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
  };
  const std::vector<double> b13 = features.w13_bias ? features.w13_bias->to_doubles() : std::vector<double>{};
  const std::vector<double> b2 = features.w2_bias ? features.w2_bias->to_doubles() : std::vector<double>{};

  const std::vector<double> xv = x.to_doubles(), wv = topk_weights.to_doubles();
  const auto ids = topk_ids.to_ints();
  // Each touched expert's weights, converted once.
  std::vector<std::vector<double>> w13v(static_cast<size_t>(e)), w2v(static_cast<size_t>(e));
  std::vector<int64_t> touched;
  {
    std::vector<bool> seen(static_cast<size_t>(e), false);
    for (int64_t id : ids) {
      if (seen[size_t(id)]) continue;
      seen[size_t(id)] = true;
      touched.push_back(id);
    }
  }
  parallel_for(int64_t(touched.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = touched[size_t(i)];
      w13v[size_t(id)] = w13.select(0, id).to_doubles();
      w2v[size_t(id)] = w2.select(0, id).to_doubles();
    }
  });
  std::vector<double> sum(size_t(n * h), 0.0);
  // Tokens are independent: each thread sums its own tokens' rows, in the serial order.
  parallel_for(n, grain_for(k * 3 * inter * h), [&](int64_t t_begin, int64_t t_end) {
    std::vector<double> hid(size_t(2 * inter)), act(static_cast<size_t>(inter)), y(static_cast<size_t>(h));
    for (int64_t t = t_begin; t < t_end; ++t) {
      const double* xt = xv.data() + t * h;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t id = ids[size_t(t * k + j)];
        const std::vector<double>& a = w13v[size_t(id)];
        for (int64_t r = 0; r < 2 * inter; ++r) {
          double s = 0;
          for (int64_t c = 0; c < h; ++c) s += a[size_t(r * h + c)] * xt[c];
          hid[size_t(r)] = b13.empty() ? s : s + b13[size_t(id * 2 * inter + r)];
        }
        const std::vector<double> hr = rounded(hid, dt);
        for (int64_t i = 0; i < inter; ++i) act[size_t(i)] = activation(hr[size_t(i)], hr[size_t(inter + i)]);
        const std::vector<double> ar = rounded(act, dt);
        const std::vector<double>& b = w2v[size_t(id)];
        for (int64_t r = 0; r < h; ++r) {
          double s = 0;
          for (int64_t c = 0; c < inter; ++c) s += b[size_t(r * inter + c)] * ar[size_t(c)];
          y[size_t(r)] = wv[size_t(t * k + j)] * (b2.empty() ? s : s + b2[size_t(id * h + r)]);
        }
        const std::vector<double> yr = rounded(y, dt);
        for (int64_t r = 0; r < h; ++r) sum[size_t(t * h + r)] += yr[size_t(r)];
      }
    }
  });
  out.copy_(Tensor::from_floats(std::vector<float>(sum.begin(), sum.end()), {n, h}, DType::f32));
}

}  // namespace kbn::reference
