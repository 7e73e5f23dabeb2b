#include "engine/nano_batch.h"

#include <algorithm>
#include <numeric>

#include "kbn/error.h"

namespace kbn::engine {

void check_nano_batching(const NanoBatching& nb, const char* what) {
  KBN_CHECK(nb.count >= 1 && nb.count <= 8, what, ": nano-batches per step must be 1 (off) .. 8, got ", nb.count);
  KBN_CHECK(nb.min_tokens >= 1, what, ": the minimum tokens per nano-batch must be >= 1, got ", nb.min_tokens);
  KBN_CHECK(nb.gemm_sms >= 0, what, ": the SMs a nano-batch's GEMMs aim at must be >= 0 (0: all), got ", nb.gemm_sms);
}

const char* nano_batch_split_name(NanoBatchSplit s) { return s == NanoBatchSplit::by_kind ? "kind" : "balanced"; }

NanoBatchSplit parse_nano_batch_split(const std::string& s, const char* what) {
  if (s == "balanced") return NanoBatchSplit::balanced;
  if (s == "kind") return NanoBatchSplit::by_kind;
  KBN_FAIL(what, ": expected balanced or kind, got '", s, "'");
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
  const size_t prefills = size_t(step.num_prefills), decodes = n - prefills;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.begin() + std::ptrdiff_t(prefills),
                   [&](size_t a, size_t b) { return step.seqs[a].num_new_tokens > step.seqs[b].num_new_tokens; });
  // Which nano-batches the prefill chunks and the decodes are dealt to: all of them, or (by kind, when the step has
  // both) the first half (at least one) for the chunks and the rest for the decodes.
  size_t prefill_parts = parts, decode_first = 0;
  if (nb.split == NanoBatchSplit::by_kind && prefills > 0 && decodes > 0) {
    prefill_parts = std::clamp<size_t>(parts / 2, 1, prefills);
    if (parts - prefill_parts > decodes) prefill_parts = parts - decodes;  // every part gets a sequence
    decode_first = prefill_parts;
  }
  std::vector<int64_t> tokens(parts, 0);
  std::vector<size_t> count(parts, 0);
  // The nano-batch of [first, last) with the fewest tokens, then the fewest sequences, then the lowest index.
  const auto lightest = [&](size_t first, size_t last) {
    size_t best = first;
    for (size_t p = first + 1; p < last; ++p)
      if (tokens[p] < tokens[best] || (tokens[p] == tokens[best] && count[p] < count[best])) best = p;
    return best;
  };
  std::vector<size_t> owner(n, 0);
  std::vector<size_t> decode_count(parts, 0);
  for (size_t k = 0; k < n; ++k) {
    const bool prefill = k < prefills;
    const size_t p = prefill ? lightest(0, prefill_parts) : lightest(decode_first, parts);
    if (prefill)
      owner[order[k]] = p;
    else
      ++decode_count[p];
    tokens[p] += step.seqs[order[k]].num_new_tokens;
    ++count[p];
  }
  // The decodes go as contiguous runs (the lowest nano-batch's first), in the numbers the dealing gave each: the
  // sampled rows then gather in one copy per nano-batch.
  size_t next = prefills;
  for (size_t p = 0; p < parts; ++p)
    for (size_t k = 0; k < decode_count[p]; ++k) owner[next++] = p;
  std::vector<NanoBatch> out(parts);
  for (size_t i = 0; i < n; ++i) {  // step order within each nano-batch: its prefills stay first
    NanoBatch& b = out[owner[i]];
    b.out.seqs.push_back(step.seqs[i]);
    b.out.num_tokens += step.seqs[i].num_new_tokens;
    if (i < prefills) ++b.out.num_prefills;
    b.indices.push_back(i);
  }
  // No part stays empty: parts <= n, a part without a sequence holds the fewest tokens of its range (every chunk has
  // one), and by kind each range has no more parts than sequences of its kind.
  for (const NanoBatch& b : out) KBN_CHECK(!b.out.empty(), "split_nano_batches: an empty nano-batch");
  return out;
}

}  // namespace kbn::engine
