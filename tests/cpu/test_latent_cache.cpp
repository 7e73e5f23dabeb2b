// The paged latent cache (LayerCacheSpec::Kind::paged_latent, MLA's one row per token) through the engine: a model
// whose next token depends on every earlier token of its sequence, read back from the latent rows it stored, must give
// the closed form under chunked prefill, mixed steps, block reuse and preemption by recompute; each stored row also
// carries its position, so a row read from the wrong block or slot is caught where it is read. And the
// non-finite locator of --check-finite, which must look at latent rows and skip layers that have no pages.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/finite_check.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "running_sum.h"
#include "kbn/error.h"
#include "kbn/forward_context.h"

namespace {

using namespace kbn;
using namespace kbn::engine;

constexpr int64_t kVocab = 89;

// Latent row of a token: [token id, position]. The hidden state of a token is the sum (mod kVocab) of the ids of its
// sequence at positions 0 .. its own, read from the cache through the block table.
class LatentSumLM : public CausalLM {
 public:
  Tensor forward(const Tensor& input_ids, const Tensor& positions) override {
    const ForwardContext& ctx = get_forward_context();
    const AttentionMetadata& md = *ctx.attn_metadata;
    Tensor& cache = (*ctx.kv_caches)[0].latent;  // [num_blocks, block_size, 2]
    KBN_CHECK(cache.defined() && cache.dim() == 3 && cache.size(2) == 2, "LatentSumLM: no latent cache");
    const int64_t bs = cache.size(1);
    const std::vector<int64_t> ids = input_ids.to_ints(), pos = positions.to_ints(),
                               slots = md.slot_mapping.to_ints(), lens = md.seq_lens.to_ints(),
                               table = md.block_tables.to_ints();
    std::vector<double> rows = cache.to_doubles();
    for (size_t t = 0; t < ids.size(); ++t) {
      if (slots[t] < 0) continue;
      rows[size_t(slots[t] * 2)] = double(ids[t]);
      rows[size_t(slots[t] * 2 + 1)] = double(pos[t]);
    }
    cache.copy_(Tensor::from_floats(std::vector<float>(rows.begin(), rows.end()), cache.shape()));
    const int64_t width = md.block_tables.size(1), num_seqs = md.num_prefills + md.num_decodes;
    const std::vector<int64_t> qsl = md.query_start_loc.to_ints();
    std::vector<float> hidden;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t q_len = s < md.num_prefills ? qsl[size_t(s) + 1] - qsl[size_t(s)] : 1;
      const int64_t seq_len = lens[size_t(s)];
      for (int64_t j = 0; j < q_len; ++j) {
        const int64_t p = seq_len - q_len + j;
        int64_t sum = 0;
        for (int64_t q = 0; q <= p; ++q) {
          const int64_t block = table[size_t(s * width + q / bs)], slot = block * bs + q % bs;
          KBN_CHECK(int64_t(rows[size_t(slot * 2 + 1)]) == q, "LatentSumLM: sequence ", s, " position ", q,
                    " reads a row stored for position ", rows[size_t(slot * 2 + 1)]);
          sum = (sum + int64_t(rows[size_t(slot * 2)])) % kVocab;
        }
        hidden.push_back(float(sum));
      }
    }
    return Tensor::from_floats(hidden, {int64_t(hidden.size()), 1});
  }
  Tensor compute_logits(const Tensor& hidden) override { return test::running_sum_logits(hidden, kVocab); }
  void load_weights(const WeightSource&) override {}
  std::vector<LayerCacheSpec> cache_specs() const override { return {LayerCacheSpec::paged_latent(2, DType::f32)}; }
  int64_t vocab_size() const override { return kVocab; }
};

std::vector<int64_t> expected_tokens(const std::vector<int64_t>& prompt, int64_t n) {
  return test::running_sum_tokens(prompt, n, kVocab);
}

std::vector<Request> requests(int64_t count) {
  std::vector<Request> rs;
  for (int64_t i = 0; i < count; ++i) {
    Request r;
    r.id = i;
    for (int64_t k = 0; k < 2 + (i * 5) % 23; ++k) r.prompt.push_back((i * 17 + k * 11) % kVocab);
    r.sampling.max_tokens = 4 + (i * 3) % 9;
    rs.push_back(r);
  }
  return rs;
}

RunResult run(int64_t budget, int64_t blocks, int64_t count) {
  LatentSumLM model;
  EngineConfig c;
  c.max_model_len = 64;
  c.block_size = 4;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 8;
  c.num_kv_blocks = blocks;
  c.enable_prefix_caching = false;
  LLMEngine engine(model, Variant::baseline, Device::cpu(), c);
  const std::vector<Request> rs = requests(count);
  RunResult res = engine.run_to_completion(rs);
  EXPECT_EQ(res.outputs.size(), rs.size());
  for (size_t i = 0; i < res.outputs.size(); ++i)
    EXPECT_EQ(res.outputs[i].tokens, expected_tokens(rs[i].prompt, rs[i].sampling.max_tokens)) << "request " << i;
  engine.scheduler().check_invariants();
  return res;
}

TEST(LatentCache, AllocatedPerLayerFromTheSpec) {
  const std::vector<KVCache> caches =
      allocate_kv_caches({LayerCacheSpec::paged_latent(576, DType::bf16)}, 3, 16, Device::cpu());
  ASSERT_EQ(caches.size(), 1u);
  EXPECT_EQ(caches[0].latent.shape(), (Shape{3, 16, 576}));
  EXPECT_EQ(caches[0].latent.dtype(), DType::bf16);
  EXPECT_FALSE(caches[0].key.defined());
  EXPECT_EQ(LayerCacheSpec::paged_latent(576, DType::bf16).bytes_per_token(), 1152);
  EXPECT_EQ(paged_bytes_per_block({LayerCacheSpec::paged_latent(576, DType::bf16)}, 64), 1152 * 64);
  EXPECT_THROW(LayerCacheSpec::paged_latent(0, DType::bf16), Error);
}

TEST(LatentCache, ChunkedPrefillAndMixedStepsReadTheirRowsBack) {
  const RunResult res = run(/*budget=*/7, /*blocks=*/512, /*count=*/14);
  EXPECT_EQ(res.preemptions, 0);
}

TEST(LatentCache, PreemptionRecomputesTheRows) {
  // 20 blocks of 4 tokens for 8 running requests of up to ~36 tokens: some are preempted and recompute.
  const RunResult res = run(/*budget=*/32, /*blocks=*/20, /*count=*/12);
  EXPECT_GT(res.preemptions, 0);
}

TEST(LatentCache, NonFiniteLocatorReadsLatentRowsAndSkipsStateLayers) {
  // Layer 0: a state layer (no pages); layer 1: latent rows; layer 2: K/V. A NaN in layer 2's keys of sequence 0 is
  // the first non-finite page: layer 1's output.
  std::vector<KVCache> caches(3);
  caches[0].states.push_back(Tensor::zeros({2, 4}, DType::f32));
  caches[1].latent = Tensor::zeros({4, 4, 3}, DType::f32);
  caches[2].key = Tensor::zeros({4, 4, 1, 2}, DType::f32);
  caches[2].value = Tensor::zeros({4, 4, 1, 2}, DType::f32);
  AttentionMetadata md;
  md.seq_lens = Tensor::from_i32({5}, {1});
  md.block_tables = Tensor::from_i32({2, 0}, {1, 2});
  std::vector<float> k(4 * 4 * 2, 0.f);
  k[(2 * 4 + 3) * 2] = std::numeric_limits<float>::quiet_NaN();  // block 2, row 3: position 3 of sequence 0
  caches[2].key = Tensor::from_floats(k, {4, 4, 1, 2});
  EXPECT_NE(locate_non_finite(Tensor(), md, caches).find("layer 1 of 3"), std::string::npos)
      << locate_non_finite(Tensor(), md, caches);
  // The same NaN in layer 1's latent rows points at layer 0.
  std::vector<float> lat(4 * 4 * 3, 0.f);
  lat[(0 * 4 + 0) * 3 + 1] = std::numeric_limits<float>::infinity();  // block 0, row 0: position 4
  caches[1].latent = Tensor::from_floats(lat, {4, 4, 3});
  EXPECT_NE(locate_non_finite(Tensor(), md, caches).find("layer 0 of 3"), std::string::npos)
      << locate_non_finite(Tensor(), md, caches);
  // Only state layers: no pages to look at, the final hidden states are blamed.
  std::vector<KVCache> states(1);
  states[0].states.push_back(Tensor::zeros({2, 4}, DType::f32));
  const Tensor nan_hidden = Tensor::from_floats({std::numeric_limits<float>::quiet_NaN()}, {1, 1});
  EXPECT_NE(locate_non_finite(nan_hidden, md, states).find("the final hidden states are not"), std::string::npos);
}

}  // namespace
