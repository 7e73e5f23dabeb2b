// grouped_topk: class GroupedTopk (tasks/baseline/L1/grouped_topk.h), DeepSeek's MoE router (vLLM's grouped_topk);
// oracle reference::grouped_topk (tasks/reference/moe.cpp).
#include "L1/grouped_topk.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(GroupedTopk)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(GroupedTopk, "L1/grouped_topk.h");
KBN_REQUIRE_CTOR(GroupedTopk, "L1/grouped_topk.h", int64_t, bool, int64_t, int64_t, const std::string&, double);
KBN_REQUIRE_METHOD(GroupedTopk, TensorPair, forward, (const Tensor&, const Tensor&), "L1/grouped_topk.h");

namespace {

// The router of a DeepSeek MoE layer: [T, E] f32 gate logits (DeepseekV2MoE's gate computes them in f32) -> its
// experts and weights, with the config's scoring, groups and (V3) score-correction bias. Sparse logits tie, so the tie
// rule is exercised.
std::vector<BenchCase> grouped_topk_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe || !m.moe->grouped_router) return {};
  const MoeShape& r = *m.moe;
  const DType dt = o.dtype;
  const int64_t es = 4, E = r.num_experts, k = r.top_k;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("grouped_topk", m, T, dt);
    b.label = "T=" + cases::str(T) + " E=" + cases::str(E) + " k=" + cases::str(k) +
              " groups=" + cases::str(r.topk_group) + "/" + cases::str(r.num_expert_group) +
              (r.sigmoid_scores ? " sigmoid" : " softmax") + (r.score_correction_bias ? " bias" : "");
    b.args.values = {{"top_k", double(k)},
                     {"renormalize", r.renormalize ? 1.0 : 0.0},
                     {"num_expert_group", double(r.num_expert_group)},
                     {"topk_group", double(r.topk_group)},
                     {"sigmoid", r.sigmoid_scores ? 1.0 : 0.0},
                     {"routed_scaling_factor", r.routed_scaling_factor}};
    const bool bias = r.score_correction_bias;
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{
          cases::normal({T, E}, DType::f32, d, seed, "gating_output", 1.0),
          bias ? cases::normal({E}, DType::f32, d, seed, "e_score_correction_bias", 0.05) : Tensor()};
    };
    b.bytes = T * E * es + (bias ? E * 4 : 0) + T * k * 8;  // logits (and bias) read; f32 weights and i32 ids written
    b.flops = 6 * T * E;                                    // score, bias, group and top-k comparisons per logit
    b.input_bytes = T * E * es + (bias ? E * 4 : 0);
    b.output_numel = 2 * T * k;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "grouped_topk",
         .class_name = "GroupedTopk",
         .level = 1,
         .header = "L1/grouped_topk.h",
         .ctor_args = {"top_k", "renormalize", "num_expert_group", "topk_group", "sigmoid", "routed_scaling_factor"},
         .args = {"gating_output", "e_score_correction_bias"},
         .mutates = {},
         .make = adapter(
             "grouped_topk", 2,
             [](const OpArgs& a) {
               return std::make_unique<GroupedTopk>(a.get_int("top_k"), a.get("renormalize") != 0,
                                                    a.get_int("num_expert_group"), a.get_int("topk_group"),
                                                    a.get("sigmoid") != 0 ? "sigmoid" : "softmax",
                                                    a.get("routed_scaling_factor"));
             },
             [](GroupedTopk& op, const Tensors& t) {
               auto [weights, ids] = op.forward(t[0], t[1]);
               return Tensors{weights, ids};
             }),
         .kernels = {"grouped_topk"},
         .cases = grouped_topk_cases});
}

}  // namespace kbn::KBN_VARIANT
