// The one step-metadata builder (kbn/step_metadata.h) by hand: a chunked prefill, a fresh prefill and two decodes,
// and its refusals.
#include <gtest/gtest.h>

#include "kbn/error.h"
#include "kbn/step_metadata.h"

using namespace kbn;

namespace {

// The error building the layout of `s` at block size 4 gives ("" when it builds).
std::string layout_error(const std::vector<StepSequence>& s) {
  try {
    build_step_layout(s, 4);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StepMetadata, MixedStepByHand) {
  // block size 4. A: 5 cached, 3 new (chunked prefill) in blocks {7, 2}; B: a 2-token prompt in {5};
  // C: 4 cached, decodes its 5th token in {1, 9}; D: 0 cached, decodes its first in {3}.
  const std::vector<int32_t> a{7, 2}, b{5}, c{1, 9}, d{3};
  const StepLayout l = build_step_layout({{5, 3, &a, true}, {0, 2, &b, true}, {4, 1, &c, false}, {0, 1, &d, false}}, 4);
  EXPECT_EQ(l.positions, (std::vector<int64_t>{5, 6, 7, 0, 1, 4, 0}));
  EXPECT_EQ(l.slot_mapping, (std::vector<int64_t>{2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 5 * 4, 5 * 4 + 1, 9 * 4, 3 * 4}));
  EXPECT_EQ(l.query_start_loc, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(l.seq_lens, (std::vector<int32_t>{8, 2, 5, 1}));
  EXPECT_EQ(l.max_blocks, 2);
  EXPECT_EQ(l.block_tables, (std::vector<int32_t>{7, 2, 5, 0, 1, 9, 3, 0}));
  EXPECT_EQ(l.num_prefills, 2);
  EXPECT_EQ(l.num_prefill_tokens, 5);
  EXPECT_EQ(l.num_decodes, 2);
  EXPECT_EQ(l.max_prefill_query_len, 3);
  EXPECT_EQ(l.max_prefill_seq_len, 8);
  EXPECT_EQ(l.max_decode_seq_len, 5);
  const AttentionMetadata md = upload_step_metadata(l, Device::cpu());
  EXPECT_EQ(md.num_tokens(), 7);
  EXPECT_EQ(md.block_tables.shape(), (Shape{4, 2}));
  EXPECT_EQ(md.slot_mapping.to_ints(), l.slot_mapping);
}

TEST(StepMetadata, RefusesWhatTheKernelsCannotServe) {
  const std::vector<int32_t> one{0};
  EXPECT_NE(layout_error({{0, 1, &one, false}, {0, 2, &one, true}}).find("prefills come first"), std::string::npos);
  EXPECT_NE(layout_error({{3, 2, &one, true}}).find("1 blocks for 5 tokens"), std::string::npos);
  EXPECT_NE(layout_error({{0, 2, &one, false}}).find("a decode feeds 1"), std::string::npos);
  EXPECT_NE(layout_error({{0, 0, &one, true}}).find("feeds 0 tokens"), std::string::npos);
}

// KV cache groups (models mixing sliding and full layers): each group's slot mapping and block table, from its own
// table; a block a sliding group gave back is written as block 0 (no kernel reads a page before its window), and a
// token to compute in a given-back block, or tables of other lengths, are refused naming the group.
TEST(StepMetadata, EveryKvCacheGroupGetsItsSlotsAndTables) {
  // block size 4. A: 9 cached, decodes token 9; group 0 {4, 5, 6}, group 1 {-1, 8, 9} (block 0 given back).
  // B: a 3-token prompt; group 0 {1}, group 1 {2}.
  const std::vector<int32_t> a0{4, 5, 6}, b0{1};
  const std::vector<std::vector<int32_t>> a1{{-1, 8, 9}}, b1{{2}};
  const StepLayout l = build_step_layout({{0, 3, &b0, true, -1, &b1}, {9, 1, &a0, false, -1, &a1}}, 4);
  EXPECT_EQ(l.num_kv_groups(), 2);
  EXPECT_EQ(l.slot_mapping, (std::vector<int64_t>{4, 5, 6, 6 * 4 + 1}));
  ASSERT_EQ(l.more_slot_mappings.size(), 1u);
  EXPECT_EQ(l.more_slot_mappings[0], (std::vector<int64_t>{8, 9, 10, 9 * 4 + 1}));
  EXPECT_EQ(l.block_tables, (std::vector<int32_t>{1, 0, 0, 4, 5, 6}));
  EXPECT_EQ(l.more_block_tables[0], (std::vector<int32_t>{2, 0, 0, 0, 8, 9}));
  const AttentionMetadata md = upload_step_metadata(l, Device::cpu());
  EXPECT_EQ(md.num_kv_groups(), 2);
  EXPECT_EQ(md.slot_mapping_of(1).to_ints(), l.more_slot_mappings[0]);
  EXPECT_EQ(md.block_tables_of(1).shape(), (Shape{2, 3}));
  EXPECT_THROW(md.block_tables_of(2), Error);

  const std::vector<std::vector<int32_t>> gone{{-1, 8}}, none{};
  EXPECT_NE(layout_error({{2, 1, &b0, false, -1, &gone}}).find("of KV cache group 1, which it released"),
            std::string::npos);
  EXPECT_NE(layout_error({{0, 2, &b0, true, -1, &b1}, {0, 2, &b0, true, -1, &none}}).find("has 1 block tables"),
            std::string::npos);
}
