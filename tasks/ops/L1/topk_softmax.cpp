// topk_softmax: class TopkSoftmax (tasks/baseline/L1/topk_softmax.h), the MoE router's top-k; oracle
// tasks/reference/moe.cpp.
#include "L1/topk_softmax.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(TopkSoftmax)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(TopkSoftmax, "L1/topk_softmax.h");
KBN_REQUIRE_CTOR(TopkSoftmax, "L1/topk_softmax.h", int64_t, bool);
KBN_REQUIRE_METHOD(TopkSoftmax, TensorPair, forward, (const Tensor&), "L1/topk_softmax.h");

namespace {

// The router of every MoE layer: [T, E] logits in the model's dtype (the gate linear's output) -> the top_k
// experts of each token and their weights. Random bf16 logits tie often, so the tie rule is exercised.
std::vector<BenchCase> topk_softmax_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), E = m.moe->num_experts, k = m.moe->top_k;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("topk_softmax", m, T, dt);
    b.label = "T=" + cases::str(T) + " E=" + cases::str(E) + " k=" + cases::str(k);
    b.args.values = {{"top_k", double(k)}, {"renormalize", m.moe->renormalize ? 1.0 : 0.0}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, E}, dt, d, seed, "gating_output", 1.0)};
    };
    b.bytes = T * E * es + T * k * 8;  // logits read; f32 weights and i32 ids written
    b.flops = 4 * T * E;               // max, exp, sum, compare per logit
    b.input_bytes = T * E * es;
    b.output_numel = 2 * T * k;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "topk_softmax",
         .class_name = "TopkSoftmax",
         .level = 1,
         .header = "L1/topk_softmax.h",
         .ctor_args = {"top_k", "renormalize"},
         .args = {"gating_output"},
         .mutates = {},
         .make = adapter(
             "topk_softmax", 1,
             [](const OpArgs& a) { return std::make_unique<TopkSoftmax>(a.get_int("top_k"), a.get("renormalize") != 0); },
             [](TopkSoftmax& op, const Tensors& t) {
               auto [weights, ids] = op.forward(t[0]);
               return Tensors{weights, ids};
             }),
         .kernels = {"topk_softmax"},
         .cases = topk_softmax_cases});
}

}  // namespace kbn::KBN_VARIANT
