// all_reduce: class AllReduce (tasks/baseline/L1/all_reduce.h: NCCL or the peer-memory kernel). Not benchmarked
// on its own: it needs a process group (tools/h200_session.sh tp times it on several GPUs).
#include "L1/all_reduce.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(AllReduce)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(AllReduce, "L1/all_reduce.h");
KBN_REQUIRE_METHOD(AllReduce, Tensor, forward, (const Tensor&), "L1/all_reduce.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "all_reduce",
         .class_name = "AllReduce",
         .level = 1,
         .header = "L1/all_reduce.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {"x"},
         .make = adapter(
             "all_reduce", 1, [](const OpArgs&) { return std::make_unique<AllReduce>(); },
             [](AllReduce& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .kernels = {"all_reduce", "nccl"}});
}

}  // namespace kbn::KBN_VARIANT
