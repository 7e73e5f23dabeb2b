#include "kbn/step_metadata.h"

#include <algorithm>
#include <string>

#include "kbn/error.h"

namespace kbn {

StepLayout build_step_layout(const std::vector<StepSequence>& seqs, int64_t block_size) {
  KBN_CHECK(block_size >= 1, "step metadata: block_size must be >= 1, got ", block_size);
  StepLayout l;
  l.query_start_loc.push_back(0);
  const auto more = [](const StepSequence& s) { return s.more_block_tables ? s.more_block_tables->size() : size_t(0); };
  const size_t groups = seqs.empty() ? 1 : 1 + more(seqs[0]);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    KBN_CHECK(s.block_table != nullptr, "step metadata: a sequence has no block table");
    KBN_CHECK(1 + more(s) == groups, "step metadata: sequence ", i, " has ", 1 + more(s), " block tables (KV cache ",
              "groups), sequence 0 has ", groups);
    l.max_blocks = std::max(l.max_blocks, int64_t(s.block_table->size()));
    for (size_t g = 1; g < groups; ++g)
      l.max_blocks = std::max(l.max_blocks, int64_t((*s.more_block_tables)[g - 1].size()));
  }
  l.block_tables.assign(seqs.size() * size_t(l.max_blocks), 0);
  l.more_block_tables.assign(groups - 1, std::vector<int32_t>(seqs.size() * size_t(l.max_blocks), 0));
  l.more_slot_mappings.assign(groups - 1, {});
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
    decodes_started = decodes_started || !s.prefill;
    for (int64_t t = begin; t < end; ++t) l.positions.push_back(t);
    for (size_t g = 0; g < groups; ++g) {
      const std::vector<int32_t>& table = g == 0 ? *s.block_table : (*s.more_block_tables)[g - 1];
      KBN_CHECK(int64_t(table.size()) * block_size >= end, "step metadata: sequence ", i, " has ", table.size(),
                " blocks for ", end, " tokens", g > 0 ? " in KV cache group " + std::to_string(g) : std::string());
      std::vector<int64_t>& slots = g == 0 ? l.slot_mapping : l.more_slot_mappings[g - 1];
      for (int64_t t = begin; t < end; ++t) {
        const int32_t b = table[size_t(t / block_size)];
        KBN_CHECK(b >= 0, "step metadata: sequence ", i, " computes token ", t, " in block ", t / block_size,
                  " of KV cache group ", g, ", which it released");
        slots.push_back(int64_t(b) * block_size + t % block_size);
      }
      int32_t* row = (g == 0 ? l.block_tables : l.more_block_tables[g - 1]).data() + int64_t(i) * l.max_blocks;
      for (size_t j = 0; j < table.size(); ++j) row[j] = std::max<int32_t>(table[j], 0);
    }
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
  for (size_t g = 0; g < l.more_block_tables.size(); ++g) {
    md.more_slot_mappings.push_back(Tensor::from_i64(l.more_slot_mappings[g], {n}).to(device));
    md.more_block_tables.push_back(Tensor::from_i32(l.more_block_tables[g], {seqs, l.max_blocks}).to(device));
  }
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
