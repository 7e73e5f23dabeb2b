// moe_align_block_size: class MoeAlignBlockSize (tasks/baseline/L1/moe_align_block_size.h), the MoE pairs grouped
// by expert and padded to the expert GEMM's block; oracle tasks/reference/moe.cpp.
#include <tuple>

#include "L1/moe_align_block_size.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MoeAlignBlockSize)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

using TensorTriple = std::tuple<Tensor, Tensor, Tensor>;
KBN_REQUIRE_CLASS(MoeAlignBlockSize, "L1/moe_align_block_size.h");
KBN_REQUIRE_CTOR(MoeAlignBlockSize, "L1/moe_align_block_size.h", int64_t, int64_t);
KBN_REQUIRE_METHOD(MoeAlignBlockSize, TensorTriple, forward, (const Tensor&), "L1/moe_align_block_size.h");

namespace {

// The block of the baseline's expert GEMM (L1/fused_experts.cu), under a uniform and a skewed routing.
constexpr int64_t kBlockSize = 128;

std::vector<BenchCase> moe_align_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.moe) return {};
  const int64_t E = m.moe->num_experts, k = m.moe->top_k;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    for (const cases::Routing routing : {cases::Routing::uniform, cases::Routing::skewed}) {
      BenchCase b = cases::base("moe_align_block_size", m, T, o.dtype);  // ids only; the dtype labels the run
      b.label = "T=" + cases::str(T) + " E=" + cases::str(E) + " k=" + cases::str(k) + " " +
                cases::routing_name(routing);
      b.args.values = {{"block_size", double(kBlockSize)}, {"num_experts", double(E)}};
      b.make_inputs = [=](Device d, uint64_t seed) {
        return std::vector<Tensor>{cases::routing_ids(T, k, E, routing, d, seed, "topk_ids")};
      };
      const int64_t padded = MoeAlignBlockSize::max_padded(T * k, kBlockSize, E);
      b.bytes = 4 * (T * k + padded + padded / kBlockSize + 1);  // ids read; the three outputs written
      b.flops = 0;
      b.input_bytes = 4 * T * k;
      b.output_numel = padded + padded / kBlockSize + 1;
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "moe_align_block_size",
         .class_name = "MoeAlignBlockSize",
         .level = 1,
         .header = "L1/moe_align_block_size.h",
         .ctor_args = {"block_size", "num_experts"},
         .args = {"topk_ids"},
         .mutates = {},
         .make = adapter(
             "moe_align_block_size", 1,
             [](const OpArgs& a) {
               return std::make_unique<MoeAlignBlockSize>(a.get_int("block_size"), a.get_int("num_experts"));
             },
             [](MoeAlignBlockSize& op, const Tensors& t) {
               auto [sorted, experts, post] = op.forward(t[0]);
               return Tensors{sorted, experts, post};
             }),
         .kernels = {"moe_align"},
         .cases = moe_align_cases,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
