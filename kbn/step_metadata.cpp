#include "kbn/step_metadata.h"

#include <algorithm>

#include "kbn/error.h"

namespace kbn {

StepLayout build_step_layout(const std::vector<StepSequence>& seqs, int64_t block_size) {
  KBN_CHECK(block_size >= 1, "step metadata: block_size must be >= 1, got ", block_size);
  StepLayout l;
  l.query_start_loc.push_back(0);
  for (const StepSequence& s : seqs) {
    KBN_CHECK(s.block_table != nullptr, "step metadata: a sequence has no block table");
    l.max_blocks = std::max(l.max_blocks, int64_t(s.block_table->size()));
  }
  l.block_tables.assign(seqs.size() * size_t(l.max_blocks), 0);
  bool decodes_started = false;
  const bool stateful = !seqs.empty() && seqs[0].state_slot >= 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    KBN_CHECK((seqs[i].state_slot >= 0) == stateful, "step metadata: sequence ", i,
              stateful ? " has no state slot while others do" : " has a state slot while others do not");
    if (stateful) {
      l.state_indices.push_back(seqs[i].state_slot);
      l.has_initial_state.push_back(seqs[i].num_computed > 0 ? 1 : 0);
    }
  }
  if (stateful) {  // two sequences writing one slot would corrupt both
    std::vector<int32_t> sorted = l.state_indices;
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    KBN_CHECK(dup == sorted.end(), "step metadata: two sequences share state slot ", dup == sorted.end() ? 0 : *dup);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    const int64_t begin = s.num_computed, end = begin + s.num_new;
    KBN_CHECK(s.num_new >= 1 && begin >= 0, "step metadata: sequence ", i, " feeds ", s.num_new, " tokens after ",
              begin, " cached ones");
    KBN_CHECK(!(s.prefill && decodes_started), "step metadata: sequence ", i,
              " is a prefill after a decode; prefills come first");
    KBN_CHECK(int64_t(s.block_table->size()) * block_size >= end, "step metadata: sequence ", i, " has ",
              s.block_table->size(), " blocks for ", end, " tokens");
    decodes_started = decodes_started || !s.prefill;
    for (int64_t t = begin; t < end; ++t) {
      l.positions.push_back(t);
      l.slot_mapping.push_back(int64_t((*s.block_table)[size_t(t / block_size)]) * block_size + t % block_size);
    }
    std::copy(s.block_table->begin(), s.block_table->end(), l.block_tables.begin() + int64_t(i) * l.max_blocks);
    l.seq_lens.push_back(int32_t(end));  // cached + new: a chunked prefill attends to its earlier chunks
    if (s.prefill) {
      l.query_start_loc.push_back(l.query_start_loc.back() + int32_t(s.num_new));
      l.max_prefill_query_len = std::max(l.max_prefill_query_len, s.num_new);
      l.max_prefill_seq_len = std::max(l.max_prefill_seq_len, end);
      l.num_prefill_tokens += s.num_new;
      l.num_prefills++;
    } else {
      KBN_CHECK(s.num_new == 1, "step metadata: decode sequence ", i, " feeds ", s.num_new, " tokens; a decode feeds 1");
      l.max_decode_seq_len = std::max(l.max_decode_seq_len, end);
      l.num_decodes++;
    }
  }
  return l;
}

AttentionMetadata upload_step_metadata(const StepLayout& l, Device device) {
  AttentionMetadata md;
  const int64_t n = l.num_tokens(), seqs = int64_t(l.seq_lens.size());
  md.num_prefills = l.num_prefills;
  md.num_prefill_tokens = l.num_prefill_tokens;
  md.num_decodes = l.num_decodes;
  md.slot_mapping = Tensor::from_i64(l.slot_mapping, {n}).to(device);
  md.query_start_loc = Tensor::from_i32(l.query_start_loc, {int64_t(l.query_start_loc.size())}).to(device);
  md.seq_lens = Tensor::from_i32(l.seq_lens, {seqs}).to(device);
  md.block_tables = Tensor::from_i32(l.block_tables, {seqs, l.max_blocks}).to(device);
  md.max_prefill_query_len = l.max_prefill_query_len;
  md.max_prefill_seq_len = l.max_prefill_seq_len;
  md.max_decode_seq_len = l.max_decode_seq_len;
  if (!l.state_indices.empty()) {
    md.state_indices = Tensor::from_i32(l.state_indices, {seqs}).to(device);
    md.has_initial_state = Tensor::from_i32(l.has_initial_state, {seqs}).to(device);
  }
  return md;
}

}  // namespace kbn
