// The one step-metadata builder (kbn/step_metadata.h) by hand: a chunked prefill, a fresh prefill and two decodes,
// and its refusals.
#include <gtest/gtest.h>

#include "kbn/error.h"
#include "kbn/step_metadata.h"

using namespace kbn;

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
  auto msg = [](const std::vector<StepSequence>& s) {
    try {
      build_step_layout(s, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({{0, 1, &one, false}, {0, 2, &one, true}}).find("prefills come first"), std::string::npos);
  EXPECT_NE(msg({{3, 2, &one, true}}).find("1 blocks for 5 tokens"), std::string::npos);
  EXPECT_NE(msg({{0, 2, &one, false}}).find("a decode feeds 1"), std::string::npos);
  EXPECT_NE(msg({{0, 0, &one, true}}).find("feeds 0 tokens"), std::string::npos);
}
