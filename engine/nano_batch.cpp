#include "engine/nano_batch.h"

#include <algorithm>
#include <numeric>

#include "kbn/error.h"

namespace kbn::engine {

void check_nano_batching(const NanoBatching& nb, const char* what) {
  KBN_CHECK(nb.count >= 1 && nb.count <= 8, what, ": nano-batches per step must be 1 (off) .. 8, got ", nb.count);
  KBN_CHECK(nb.min_tokens >= 1, what, ": the minimum tokens per nano-batch must be >= 1, got ", nb.min_tokens);
}

std::vector<NanoBatch> split_nano_batches(const SchedulerOutput& step, const NanoBatching& nb) {
  check_nano_batching(nb, "split_nano_batches");
  const size_t n = step.seqs.size();
  const size_t parts = std::min<size_t>(size_t(nb.count), n);
  if (parts <= 1 || step.num_tokens < int64_t(parts) * nb.min_tokens) {
    NanoBatch whole{step, std::vector<size_t>(n)};
    whole.out.preempted_ids.clear();
    std::iota(whole.indices.begin(), whole.indices.end(), size_t(0));
    return {whole};
  }
  // Largest prefill chunk first (ties in step order), then the decodes in step order.
  const size_t prefills = size_t(step.num_prefills);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.begin() + std::ptrdiff_t(prefills), [&](size_t a, size_t b) {
    return step.seqs[a].num_new_tokens > step.seqs[b].num_new_tokens;
  });
  std::vector<int64_t> tokens(parts, 0);
  std::vector<size_t> count(parts, 0);
  // The nano-batch with the fewest tokens, then the fewest sequences, then the lowest index.
  const auto lightest = [&] {
    size_t best = 0;
    for (size_t p = 1; p < parts; ++p)
      if (tokens[p] < tokens[best] || (tokens[p] == tokens[best] && count[p] < count[best])) best = p;
    return best;
  };
  std::vector<size_t> owner(n, 0);
  for (size_t k = 0; k < n; ++k) {
    const size_t p = lightest();
    if (k < prefills) owner[order[k]] = p;
    tokens[p] += step.seqs[order[k]].num_new_tokens;
    ++count[p];
  }
  // The decodes go as contiguous runs (nano-batch 0's first), in the numbers the dealing gave each: the sampled rows
  // then gather in one copy per nano-batch.
  size_t next = prefills;
  for (size_t p = 0; p < parts; ++p) {
    size_t decodes = count[p];
    for (size_t i = 0; i < prefills; ++i) decodes -= owner[i] == p ? 1 : 0;
    for (size_t k = 0; k < decodes; ++k) owner[next++] = p;
  }
  std::vector<NanoBatch> out(parts);
  for (size_t i = 0; i < n; ++i) {  // step order within each nano-batch: its prefills stay first
    NanoBatch& b = out[owner[i]];
    b.out.seqs.push_back(step.seqs[i]);
    b.out.num_tokens += step.seqs[i].num_new_tokens;
    if (i < prefills) ++b.out.num_prefills;
    b.indices.push_back(i);
  }
  // No part stays empty: parts <= n, and a part without a sequence holds the fewest tokens (every chunk has one).
  for (const NanoBatch& b : out) KBN_CHECK(!b.out.empty(), "split_nano_batches: an empty nano-batch");
  return out;
}

}  // namespace kbn::engine
