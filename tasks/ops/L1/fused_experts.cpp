// fused_experts: class FusedExperts (tasks/baseline/L1/fused_experts.h), the MoE expert MLPs (gate/up GEMM, the
// activation (silu and mul, or gpt-oss's swigluoai), down GEMM with the routing weight, per-token sum; gpt-oss's
// expert biases); oracle tasks/reference/moe.cpp.
#include <cmath>
#include <set>

#include "L1/fused_experts.h"
#include "ops/op.h"
#include "reference/reference.h"

KBN_FALLBACK_CLASS(FusedExperts)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FusedExperts, "L1/fused_experts.h");
KBN_REQUIRE_CTOR(FusedExperts, "L1/fused_experts.h", FusedExperts::Activation, double, double);
KBN_REQUIRE_METHOD(FusedExperts, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&),
                   "L1/fused_experts.h");

namespace {

// Three routings of each token count:
//   uniform, skewed: cases::routing_ids (every expert equally likely; Zipf-like hot experts), weights positive and
//     summing to 1 per token;
//   router: what the random-weight model's own router hands over: logits distributed as its gate's output
//     (x ~ N(0, 1) against gate rows ~ N(0, 0.02): N(0, 0.02^2 hidden)) through the oracle's topk_softmax with the
//     config's renormalisation.
enum class Route { uniform, skewed, router };
const char* route_name(Route r) { return r == Route::uniform ? "uniform" : r == Route::skewed ? "skewed" : "router"; }

// (topk_weights, topk_ids) on `d`.
std::pair<Tensor, Tensor> make_routing(Route r, int64_t T, int64_t k, int64_t E, int64_t H, bool renormalize, Device d,
                                       uint64_t seed) {
  if (r != Route::router) {
    const auto routing = r == Route::uniform ? cases::Routing::uniform : cases::Routing::skewed;
    return {cases::routing_weights(T, k, d, seed, "topk_weights"),
            cases::routing_ids(T, k, E, routing, d, seed, "topk_ids")};
  }
  const Tensor logits =
      cases::normal({T, E}, DType::f32, Device::cpu(), seed, "router_logits", cases::kWeightStd * std::sqrt(double(H)));
  Tensor w = Tensor::empty({T, k}, DType::f32, Device::cpu()), ids = Tensor::empty({T, k}, DType::i32, Device::cpu());
  reference::topk_softmax(w, ids, logits, renormalize);
  return {w.to(d), ids.to(d)};
}

std::vector<BenchCase> fused_experts_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size, E = m.moe->num_experts, k = m.moe->top_k;
  const int64_t N = m.moe->intermediate_size;
  const bool renormalize = m.moe->renormalize;
  // gpt-oss's experts (ModelView::moe): swigluoai with the config's alpha and limit, and biases (w13_bias, w2_bias
  // as two more inputs, drawn like the weights' outputs so they move the activations).
  const bool oai = m.moe->swigluoai, bias = m.moe->expert_bias;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    for (const Route route : {Route::uniform, Route::skewed, Route::router}) {
      BenchCase b = cases::base("fused_experts", m, T, dt);
      b.label = "T=" + cases::str(T) + " E=" + cases::str(E) + " k=" + cases::str(k) + " H=" + cases::str(H) +
                " N=" + cases::str(N) + " " + route_name(route) + (oai ? " swigluoai" : "") + (bias ? " bias" : "");
      if (oai) b.args.values = {{"activation", 1.0}, {"alpha", m.moe->swiglu_alpha}, {"limit", m.moe->swiglu_limit}};
      b.make_inputs = [=](Device d, uint64_t seed) {
        auto [w, ids] = make_routing(route, T, k, E, H, renormalize, d, seed);
        std::vector<Tensor> in{cases::normal({T, H}, dt, d, seed, "hidden_states", 1.0),
                               cases::normal({E, 2 * N, H}, dt, d, seed, "w13", cases::kWeightStd),
                               cases::normal({E, H, N}, dt, d, seed, "w2", cases::kWeightStd), w, ids};
        if (bias) {
          in.push_back(cases::normal({E, 2 * N}, dt, d, seed, "w13_bias", cases::kWeightStd * std::sqrt(double(H))));
          in.push_back(cases::normal({E, H}, dt, d, seed, "w2_bias", cases::kWeightStd * std::sqrt(double(N))));
        }
        return in;
      };
      // Bytes: the weights of the experts the routing touches (counted on the routing of seed 0; other seeds touch
      // the same number of experts up to a few at small T), x read, out written, the routing read.
      const auto [w0, ids0] = make_routing(route, T, k, E, H, renormalize, Device::cpu(), 0);
      const auto id_values = ids0.to_ints();
      const int64_t touched = int64_t(std::set<int64_t>(id_values.begin(), id_values.end()).size());
      b.bytes = touched * (3 * H * N + (bias ? 2 * N + H : 0)) * es + 2 * T * H * es + T * k * 8;
      b.flops = 2 * T * k * 3 * H * N;
      b.input_bytes = (E * (3 * H * N + (bias ? 2 * N + H : 0)) + T * H) * es + T * k * 8;
      b.output_numel = T * H;
      b.note = cases::str(touched) + " of " + cases::str(E) + " experts touched";
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add(
      {.name = "fused_experts",
       .class_name = "FusedExperts",
       .level = 1,
       .header = "L1/fused_experts.h",
       .ctor_args = {"activation (optional: 0 silu, 1 swigluoai)", "alpha (optional)", "limit (optional)"},
       .args = {"hidden_states", "w13", "w2", "topk_weights", "topk_ids", "w13_bias (optional)", "w2_bias (optional)"},
       .mutates = {},
       .make = adapter(
           "fused_experts", 5, 7,
           [](const OpArgs& a) {
             const int64_t act = a.get_int_or("activation", 0);
             KBN_CHECK(act == 0 || act == 1,
                       "fused_experts: argument 'activation' must be 0 (silu) or 1 (swigluoai), got ", act);
             return std::make_unique<FusedExperts>(
                 act == 1 ? FusedExperts::Activation::swigluoai : FusedExperts::Activation::silu, a.get("alpha", 1.702),
                 a.get("limit", 7.0));
           },
           [](FusedExperts& op, const Tensors& t) {
             KBN_CHECK(t.size() != 6, "fused_experts: the biases come as a pair (w13_bias, w2_bias), got one");
             if (t.size() == 7) return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6])};
             return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4])};
           }),
       // Its alignment kernels, and the sum when GEMM 2 is not split, are the moe_align_block_size and moe_sum
       // ops' own: a kernel trace shows them on their own lines. The split-K reduces and the decode path's GEMVs
       // (up to 8 tokens) are this op's.
       .kernels = {"moe_permute", "moe_expert_gemm", "moe_act_mul_splits", "moe_sum_splits", "moe_gemv"},
       .cases = fused_experts_cases});
}

}  // namespace kbn::KBN_VARIANT
