#include "engine/finite_check.h"

#include <map>

#include "kbn/error.h"
#include "kbn/weight_loading.h"

namespace kbn::engine {

namespace {

// Rows [0, rows) of one block of a layer's K or V cache ([num_blocks, block_size, heads, head_size]) hold NaN/Inf.
bool block_rows_non_finite(const Tensor& cache, int64_t block, int64_t rows) {
  const Tensor b = cache.slice(0, block, block + 1).to(Device::cpu()).contiguous();
  const int64_t per_row = b.numel() / cache.size(1);
  const Tensor used = b.reshape({cache.size(1), per_row}).slice(0, 0, rows);
  return non_finite_count(used.contiguous()) > 0;
}

}  // namespace

std::string locate_non_finite(const Tensor& hidden, const AttentionMetadata& md, const std::vector<KVCache>& caches) {
  const int64_t layers = int64_t(caches.size());
  // The paged tensors of a layer (K and V, or the latent rows); recurrent-state layers have none to look at.
  const auto paged = [&](int64_t l) {
    std::vector<const Tensor*> t;
    for (const Tensor* x : {&caches[size_t(l)].key, &caches[size_t(l)].value, &caches[size_t(l)].latent})
      if (x->defined()) t.push_back(x);
    return t;
  };
  int64_t block_size = 0;
  for (int64_t l = 0; l < layers && block_size == 0; ++l)
    if (!paged(l).empty()) block_size = paged(l).front()->size(1);
  if (block_size > 0 && md.block_tables.defined() && md.seq_lens.defined()) {
    const std::vector<int64_t> lens = md.seq_lens.to(Device::cpu()).to_ints();
    std::vector<std::vector<int64_t>> group_tables;  // per KV cache group, [num_seqs, width]
    for (int64_t g = 0; g < md.num_kv_groups(); ++g)
      group_tables.push_back(md.block_tables_of(g).to(Device::cpu()).to_ints());
    const int64_t width = md.block_tables.dim() == 2 ? md.block_tables.size(1) : 0;
    for (int64_t l = 0; l < layers; ++l) {
      const KVCache& c = caches[size_t(l)];
      if (paged(l).empty() || c.kv_group >= int64_t(group_tables.size())) continue;
      const std::vector<int64_t>& table = group_tables[size_t(c.kv_group)];
      bool bad = false;
      for (size_t s = 0; s < lens.size() && !bad; ++s) {
        // A sliding layer's blocks before the window of the sequence's last token may have been given back.
        const int64_t first = c.sliding_window > 0 ? std::max<int64_t>(0, lens[s] - c.sliding_window) / block_size : 0;
        for (int64_t bi = first; bi * block_size < lens[s] && bi < width && !bad; ++bi) {
          const int64_t block = table[s * size_t(width) + size_t(bi)];
          const int64_t rows = std::min(block_size, lens[s] - bi * block_size);
          if (block < 0) continue;
          for (const Tensor* t : paged(l)) bad = bad || block_rows_non_finite(*t, block, rows);
        }
      }
      if (!bad) continue;
      if (l == 0)
        return "the embedding (layer 0's keys/values of this step's sequences are the first that are not finite, so "
               "its input already was not)";
      return "layer " + std::to_string(l - 1) + " of " + std::to_string(layers) + " (model.layers." +
             std::to_string(l - 1) + "; layer " + std::to_string(l) +
             "'s keys/values of this step's sequences are the first that are not finite, so its input, layer " +
             std::to_string(l - 1) + "'s output, was not)";
    }
  }
  if (hidden.defined() && non_finite_count(hidden) > 0)
    return "layer " + std::to_string(layers - 1) + " of " + std::to_string(layers) +
           " (the last) or the final norm: every layer's keys/values are finite, the final hidden states are not";
  return "the LM head: every layer's keys/values and the final hidden states are finite, the logits are not";
}

void check_logits_finite(const Tensor& logits, const Tensor& hidden, const AttentionMetadata& md,
                         const std::vector<KVCache>& caches, const std::string& step) {
  const int64_t bad = non_finite_count(logits);
  if (bad == 0) return;
  KBN_FAIL("non-finite values (--check-finite): ", step, ": the logits are not finite (", bad, " of ", logits.numel(),
           " values NaN or Inf); first non-finite layer output: ", locate_non_finite(hidden, md, caches));
}

}  // namespace kbn::engine
