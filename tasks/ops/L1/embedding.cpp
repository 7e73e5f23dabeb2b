// embedding: class Embedding (tasks/baseline/L1/embedding.h), oracle tasks/reference/embedding.cpp.
#include "L1/embedding.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Embedding)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Embedding, "L1/embedding.h");
KBN_REQUIRE_METHOD(Embedding, Tensor, forward, (const Tensor&, const Tensor&, int64_t, int64_t), "L1/embedding.h");
KBN_REQUIRE_METHOD(Embedding, Tensor, forward, (const Tensor&, const Tensor&, int64_t, int64_t, double),
                   "L1/embedding.h");

namespace {

std::vector<BenchCase> embedding_cases(const ModelView& m, const CaseOptions& o) {
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size, V = m.vocab_size;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("embedding", m, T, dt);
    b.label = "T=" + cases::str(T) + " V=" + cases::str(V) + " H=" + cases::str(H);
    // NOTE: ids stay inside this rank's shard: the adapter passes the whole weight as the shard.
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::randint({T}, DType::i64, d, seed, "input_ids", 0, V),
                                 cases::normal({V, H}, dt, d, seed, "weight", cases::kWeightStd)};
    };
    b.bytes = T * 8 + 2 * T * H * es;  // ids read, the T gathered rows read (not the whole table), out written
    b.flops = 0;
    b.input_bytes = T * 8 + V * H * es;
    b.output_numel = T * H;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "embedding",
         .class_name = "Embedding",
         .level = 1,
         .header = "L1/embedding.h",
         .ctor_args = {},
         .args = {"input_ids", "weight"},
         .mutates = {},
         .make = adapter(
             "embedding", 2, [](const OpArgs&) { return std::make_unique<Embedding>(); },
             [](Embedding& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], 0, t[1].size(0))}; }),
         .kernels = {"embedding_kernel"},
         .cases = embedding_cases,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
