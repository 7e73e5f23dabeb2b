// Oracle: greedy sampling (argmax over the vocabulary).
#include <cmath>
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kOp = "reference::argmax";

}  // namespace

void argmax(Tensor& out, const Tensor& logits) {
  check_rank(logits, kOp, "logits", 2, "[num_tokens, vocab]");
  check_dtype(logits, kOp, "logits", {DType::f32, DType::f16, DType::bf16});
  check_cpu(logits, kOp, "logits");
  KBN_CHECK(logits.size(1) >= 1, kOp, ": argument 'logits' [num_tokens, vocab] needs vocab >= 1, got ", logits.str());
  const int64_t num_tokens = logits.size(0), vocab = logits.size(1);
  check_rank(out, kOp, "out", 1, "[num_tokens]");
  check_dtype(out, kOp, "out", {DType::i64});
  check_cpu(out, kOp, "out");
  check_size(out, kOp, "out", 0, num_tokens, "num_tokens = logits.size(0)");

  const std::vector<double> x = logits.to_doubles();
  std::vector<int64_t> best(size_t(num_tokens), 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const double* row = &x[size_t(t * vocab)];
    int64_t arg = -1;
    for (int64_t v = 0; v < vocab; ++v) {
      if (std::isnan(row[v])) continue;
      // Strictly greater: on a tie the lower index stays.
      if (arg < 0 || row[v] > row[arg]) arg = v;
    }
    best[size_t(t)] = arg < 0 ? 0 : arg;
  }
  out.copy_(Tensor::from_i64(best, {num_tokens}));
}

}  // namespace kbn::reference
