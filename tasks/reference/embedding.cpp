// Oracle: embedding gather (the lookup inside vLLM's VocabParallelEmbedding).
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kOp = "reference::embedding";

}  // namespace

void embedding(Tensor& out, const Tensor& ids, const Tensor& weight) {
  check_rank(ids, kOp, "ids", 1, "[num_tokens]");
  check_dtype(ids, kOp, "ids", {DType::i32, DType::i64});
  check_cpu(ids, kOp, "ids");
  check_rank(weight, kOp, "weight", 2, "[vocab, hidden]");
  check_dtype(weight, kOp, "weight", {DType::f32, DType::f16, DType::bf16});
  check_cpu(weight, kOp, "weight");
  const int64_t num_tokens = ids.size(0), vocab = weight.size(0), hidden = weight.size(1);
  check_rank(out, kOp, "out", 2, "[num_tokens, hidden]");
  check_dtype(out, kOp, "out", {DType::f32, DType::f16, DType::bf16});
  check_cpu(out, kOp, "out");
  check_size(out, kOp, "out", 0, num_tokens, "num_tokens = ids.size(0)");
  check_size(out, kOp, "out", 1, hidden, "hidden = weight.size(1)");

  const std::vector<int64_t> id = ids.to_ints();
  for (int64_t t = 0; t < num_tokens; ++t) {
    KBN_CHECK(id[size_t(t)] >= 0 && id[size_t(t)] < vocab, kOp, ": argument 'ids': token ", t, " has id ",
              id[size_t(t)], ", outside [0, vocab = ", vocab, ")");
  }
  // A gather is a copy: row views and copy_ keep the bits exactly when the dtypes match (and round once when not).
  for (int64_t t = 0; t < num_tokens; ++t) out.select(0, t).copy_(weight.select(0, id[size_t(t)]));
}

}  // namespace kbn::reference
