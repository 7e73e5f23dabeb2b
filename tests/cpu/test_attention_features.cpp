// The attention oracle's per-layer features (tasks/reference/reference.h AttentionFeatures: sliding window, logit
// soft-cap, sinks) against a dense attention written here from the definitions, and the properties that pin each
// feature down on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "L2/attention.h"
#include "kbn/forward_context.h"
#include "kbn/op_case.h"
#include "kbn/error.h"
#include "kbn/tensor.h"
#include "reference/reference.h"

namespace kbn {
namespace {

using reference::AttentionFeatures;

// Two sequences over a paged cache of 4-token blocks: sequence 0 has 4 cached keys and 3 new queries (7 keys),
// sequence 1 has 5 new queries and no cache. 4 query heads over 2 kv heads, head size 8.
constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 8, kBlock = 4;
const std::vector<int64_t> kSeqLens = {7, 5}, kQueryLens = {3, 5};

struct Batch {
  Tensor q, key_cache, value_cache, query_start_loc, seq_lens, block_tables;
  std::vector<float> qv, kv, vv;  // q [tokens, H, D]; caches [blocks, block, Hk, D]
};

float value_at(uint64_t i, uint64_t salt) {  // deterministic values in [-2, 2)
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return float(double(x % 4096) / 1024.0 - 2.0);
}

Batch make_batch() {
  Batch b;
  const int64_t tokens = kQueryLens[0] + kQueryLens[1], blocks = 4;
  for (int64_t i = 0; i < tokens * kHeads * kDim; ++i) b.qv.push_back(value_at(uint64_t(i), 1));
  for (int64_t i = 0; i < blocks * kBlock * kKvHeads * kDim; ++i) {
    b.kv.push_back(value_at(uint64_t(i), 2));
    b.vv.push_back(value_at(uint64_t(i), 3));
  }
  b.q = Tensor::from_floats(b.qv, {tokens, kHeads, kDim});
  b.key_cache = Tensor::from_floats(b.kv, {blocks, kBlock, kKvHeads, kDim});
  b.value_cache = Tensor::from_floats(b.vv, {blocks, kBlock, kKvHeads, kDim});
  b.query_start_loc = Tensor::from_i32({0, int32_t(kQueryLens[0]), int32_t(tokens)}, {3});
  b.seq_lens = Tensor::from_i32({int32_t(kSeqLens[0]), int32_t(kSeqLens[1])}, {2});
  b.block_tables = Tensor::from_i32({2, 0, 3, 1}, {2, 2});  // sequence 0: blocks 2, 0; sequence 1: blocks 3, 1
  return b;
}

// Dense attention from the definitions: masked scores, then softmax with the sink as an extra column with no value.
std::vector<double> dense(const Batch& b, double scale, int64_t window, double cap, const std::vector<double>& sinks) {
  const std::vector<int64_t> table = b.block_tables.to_ints();
  std::vector<double> out;
  for (int64_t s = 0, row0 = 0; s < 2; row0 += kQueryLens[size_t(s)], ++s) {
    for (int64_t j = 0; j < kQueryLens[size_t(s)]; ++j) {
      const int64_t pos = kSeqLens[size_t(s)] - kQueryLens[size_t(s)] + j;
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t g = h / (kHeads / kKvHeads);
        std::vector<double> score(size_t(kSeqLens[size_t(s)]), -std::numeric_limits<double>::infinity());
        for (int64_t p = 0; p < kSeqLens[size_t(s)]; ++p) {
          const bool visible = p <= pos && (window == 0 || pos - p < window);
          if (!visible) continue;
          const int64_t at = ((table[size_t(s * 2 + p / kBlock)] * kBlock + p % kBlock) * kKvHeads + g) * kDim;
          double dot = 0;
          for (int64_t d = 0; d < kDim; ++d) dot += double(b.qv[size_t(((row0 + j) * kHeads + h) * kDim + d)]) * b.kv[size_t(at + d)];
          score[size_t(p)] = cap > 0 ? cap * std::tanh(scale * dot / cap) : scale * dot;
        }
        double top = sinks.empty() ? -INFINITY : sinks[size_t(h)];
        for (double x : score) top = std::max(top, x);
        double denom = sinks.empty() ? 0 : std::exp(sinks[size_t(h)] - top);
        for (double x : score) denom += std::exp(x - top);
        for (int64_t d = 0; d < kDim; ++d) {
          double acc = 0;
          for (int64_t p = 0; p < kSeqLens[size_t(s)]; ++p) {
            const int64_t at = ((table[size_t(s * 2 + p / kBlock)] * kBlock + p % kBlock) * kKvHeads + g) * kDim;
            acc += std::exp(score[size_t(p)] - top) * b.vv[size_t(at + d)];
          }
          out.push_back(acc / denom);
        }
      }
    }
  }
  return out;
}

std::vector<double> oracle_prefill(const Batch& b, double scale, const AttentionFeatures& f) {
  Tensor out = Tensor::zeros(b.q.shape(), DType::f32);
  reference::paged_attention_prefill(out, b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens,
                                     b.block_tables, scale, f);
  return out.to_doubles();
}

void expect_near_all(const std::vector<double>& a, const std::vector<double>& e, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], e[i], tol * (1 + std::abs(e[i]))) << what << " at " << i;
}

TEST(AttentionFeatures, OracleMatchesDenseAttentionWithEveryFeature) {
  const Batch b = make_batch();
  const double scale = 1 / std::sqrt(double(kDim));
  const Tensor sinks = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {kHeads});
  const std::vector<double> sv = sinks.to_doubles();
  struct Case {
    int64_t window;
    double cap;
    bool with_sinks;
  };
  for (const Case c : {Case{0, 0, false}, Case{3, 0, false}, Case{0, 1.5, false}, Case{0, 0, true},
                       Case{2, 1.5, true}, Case{6, 0, true}}) {
    AttentionFeatures f;
    f.sliding_window = c.window;
    f.logits_soft_cap = c.cap;
    f.sinks = c.with_sinks ? &sinks : nullptr;
    // The oracle rounds its output to f32.
    expect_near_all(oracle_prefill(b, scale, f), dense(b, scale, c.window, c.cap, c.with_sinks ? sv : std::vector<double>{}),
                    1e-6, "window " + std::to_string(c.window) + " cap " + std::to_string(c.cap) +
                              (c.with_sinks ? " sinks" : ""));
  }
}

// Values narrower than keys (flash_attn_varlen_func's v; DeepSeek's MLA prefill): the op's output takes the values'
// width, and each of its columns is the one dense attention gives with the full-width values.
TEST(AttentionFeatures, ValuesNarrowerThanKeysKeepEveryFeature) {
  const Batch b = make_batch();
  constexpr int64_t kDimV = 5;
  const Tensor narrow = b.value_cache.slice(3, 0, kDimV).contiguous();
  const std::vector<double> sinks = {0.5, -1.0, 2.0, 0.0};
  const Tensor sinks_t = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {kHeads});
  const double scale = 0.3;
  baseline::FlashAttnPrefill op(kHeads, kDim, scale, kKvHeads, /*sliding_window=*/3, /*logits_soft_cap=*/2.0);
  const Tensor got = op.forward(b.q, b.key_cache, narrow, b.query_start_loc, b.seq_lens, b.block_tables, 5, 7, sinks_t);
  ASSERT_EQ(got.shape(), (Shape{b.q.size(0), kHeads, kDimV}));
  const std::vector<double> full = dense(b, scale, 3, 2.0, sinks);
  std::vector<double> want;
  for (size_t i = 0; i < full.size(); ++i)
    if (int64_t(i % kDim) < kDimV) want.push_back(full[i]);
  expect_near_all(got.to_doubles(), want, 1e-5, "values 5 wide, keys 8");
}

TEST(AttentionFeatures, EachFeatureOnItsOwn) {
  const Batch b = make_batch();
  const double scale = 0.3;
  const std::vector<double> full = oracle_prefill(b, scale, {});
  // A window as long as the longest sequence masks nothing.
  AttentionFeatures wide;
  wide.sliding_window = 7;
  EXPECT_EQ(oracle_prefill(b, scale, wide), full);
  // A window of one: each query sees only its own key, so the output is that key's value row.
  AttentionFeatures own;
  own.sliding_window = 1;
  const std::vector<double> one = oracle_prefill(b, scale, own);
  const std::vector<double> dense_one = dense(b, scale, 1, 0, {});
  EXPECT_EQ(one, std::vector<double>(dense_one.begin(), dense_one.end()));
  // A window of 3 differs from full attention (the test's sequences are longer than 3).
  AttentionFeatures three;
  three.sliding_window = 3;
  EXPECT_NE(oracle_prefill(b, scale, three), full);
  // A soft cap far above every score changes nothing measurable; a low one bounds the scores and changes the result.
  AttentionFeatures loose;
  loose.logits_soft_cap = 1e6;
  expect_near_all(oracle_prefill(b, scale, loose), full, 1e-6, "cap 1e6");
  AttentionFeatures tight;
  tight.logits_soft_cap = 0.25;
  EXPECT_NE(oracle_prefill(b, scale, tight), full);
  // A sink of -inf adds nothing; a very large one takes all the weight, so every output goes to zero.
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor none = Tensor::from_floats({-inf, -inf, -inf, -inf}, {kHeads});
  AttentionFeatures no_sink;
  no_sink.sinks = &none;
  EXPECT_EQ(oracle_prefill(b, scale, no_sink), full);
  const Tensor huge = Tensor::from_floats({80.f, 80.f, 80.f, 80.f}, {kHeads});
  AttentionFeatures all_sink;
  all_sink.sinks = &huge;
  for (double v : oracle_prefill(b, scale, all_sink)) EXPECT_NEAR(v, 0.0, 1e-20);
}

TEST(AttentionFeatures, DecodeSeesTheLastWindowOfKeys) {
  const Batch b = make_batch();
  // Decode queries: the last query row of each sequence, over the same cache: equal to the prefill's last rows.
  std::vector<float> last;
  for (int64_t row : {kQueryLens[0] - 1, kQueryLens[0] + kQueryLens[1] - 1})
    for (int64_t i = 0; i < kHeads * kDim; ++i) last.push_back(b.qv[size_t(row * kHeads * kDim + i)]);
  const Tensor q = Tensor::from_floats(last, {2, kHeads, kDim});
  const Tensor sinks = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {kHeads});
  AttentionFeatures f;
  f.sliding_window = 3;
  f.logits_soft_cap = 2.0;
  f.sinks = &sinks;
  Tensor out = Tensor::zeros({2, kHeads, kDim}, DType::f32);
  reference::paged_attention_decode(out, q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, 0.4, f);
  const std::vector<double> prefill = oracle_prefill(b, 0.4, f), decode = out.to_doubles();
  const int64_t row_elems = kHeads * kDim;
  for (int64_t i = 0; i < row_elems; ++i) {
    EXPECT_EQ(decode[size_t(i)], prefill[size_t((kQueryLens[0] - 1) * row_elems + i)]);
    EXPECT_EQ(decode[size_t(row_elems + i)], prefill[size_t((kQueryLens[0] + kQueryLens[1] - 1) * row_elems + i)]);
  }
}

TEST(AttentionFeatures, BadFeaturesNameTheArgument) {
  const Batch b = make_batch();
  auto message = [&](const AttentionFeatures& f) {
    try {
      (void)oracle_prefill(b, 1.0, f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AttentionFeatures neg;
  neg.sliding_window = -1;
  EXPECT_NE(message(neg).find("'sliding_window' must be >= 0"), std::string::npos) << message(neg);
  AttentionFeatures nan_cap;
  nan_cap.logits_soft_cap = std::nan("");
  EXPECT_NE(message(nan_cap).find("'logits_soft_cap'"), std::string::npos) << message(nan_cap);
  const Tensor three = Tensor::from_floats({0.f, 0.f, 0.f}, {3});
  AttentionFeatures short_sinks;
  short_sinks.sinks = &three;
  EXPECT_NE(message(short_sinks).find("'sinks'"), std::string::npos) << message(short_sinks);
  const Tensor with_nan = Tensor::from_floats({0.f, std::nanf(""), 0.f, 0.f}, {kHeads});
  AttentionFeatures nan_sink;
  nan_sink.sinks = &with_nan;
  EXPECT_NE(message(nan_sink).find("'sinks' holds NaN at head 1"), std::string::npos) << message(nan_sink);
}

// The ops pass their features to the oracle on CPU tensors (the CUDA paths are tested against it on the GPU:
// tests/gpu/test_attention.cpp, FlashAttnFeaturesGpu).
TEST(AttentionFeatures, OpsCarryTheirFeatures) {
  const Batch b = make_batch();
  const double scale = 0.35;
  const Tensor sinks = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {kHeads});
  AttentionFeatures f;
  f.sliding_window = 3;
  f.logits_soft_cap = 1.5;
  f.sinks = &sinks;
  baseline::FlashAttnPrefill prefill(kHeads, kDim, scale, kKvHeads, 3, 1.5);
  EXPECT_EQ(prefill.sliding_window(), 3);
  EXPECT_EQ(prefill.logits_soft_cap(), 1.5);
  const Tensor with = prefill.forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables,
                                      5, 7, sinks);
  EXPECT_EQ(with.to(DType::f32).to_doubles(), oracle_prefill(b, scale, f));
  AttentionFeatures no_sinks = f;
  no_sinks.sinks = nullptr;
  const Tensor without = prefill.forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens,
                                         b.block_tables, 5, 7);
  EXPECT_EQ(without.to(DType::f32).to_doubles(), oracle_prefill(b, scale, no_sinks));
  // A plain op is the old attention.
  baseline::FlashAttnPrefill plain(kHeads, kDim, scale, kKvHeads);
  EXPECT_EQ(plain.forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables, 5, 7)
                .to(DType::f32)
                .to_doubles(),
            oracle_prefill(b, scale, {}));

  baseline::FlashAttnDecode decode(kHeads, kDim, scale, kKvHeads, 3, 1.5);
  const Tensor q = Tensor::from_floats(std::vector<float>(b.qv.begin(), b.qv.begin() + 2 * kHeads * kDim),
                                       {2, kHeads, kDim});
  Tensor expected = Tensor::zeros({2, kHeads, kDim}, DType::f32);
  reference::paged_attention_decode(expected, q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, scale, f);
  EXPECT_EQ(decode.forward(q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, 7, sinks).to_doubles(),
            expected.to_doubles());
}

TEST(AttentionFeatures, OpsRefuseBadFeaturesNamingTheArgument) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { baseline::FlashAttnPrefill(4, 8, 0.3, 2, -2); }).find("argument 'sliding_window'"),
            std::string::npos);
  EXPECT_NE(message([] { baseline::FlashAttnDecode(4, 8, 0.3, 2, 0, std::nan("")); }).find("argument 'logits_soft_cap'"),
            std::string::npos);
  const Batch b = make_batch();
  baseline::FlashAttnPrefill op(kHeads, kDim, 0.3, kKvHeads);
  const Tensor two = Tensor::from_floats({0.f, 0.f}, {2});
  const std::string m = message([&] {
    op.forward(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_tables, 5, 7, two);
  });
  EXPECT_NE(m.find("flash_attn_prefill: argument 'sinks'"), std::string::npos) << m;
}

}  // namespace
}  // namespace kbn

// ---- the attention layer (L2 Attention) carries its layer's features to both kernels ----

namespace kbn {
namespace {

// One step under a forward context: the layer stores the step's K/V, then attends with its features. The expected
// output is the ops' own (CPU: the oracle) on the cache the layer wrote, with the same features; a layer that drops
// a feature gives the featureless output, which differs.
void check_layer_features(const cases::StepShape& st, const std::string& what) {
  constexpr int64_t H = 4, Hk = 2, D = 16, W = 6;
  constexpr double cap = 3.0;
  const double scale = 1.0 / std::sqrt(double(D));
  const Tensor sinks = cases::normal({H}, DType::f32, Device::cpu(), 3, "sinks", 1.0);
  baseline::Attention layer(H, D, scale, Hk, "model.layers.0.self_attn.attn", W, cap, &sinks);
  EXPECT_EQ(layer.cache_spec(DType::bf16).describe(), "paged K/V 2 x 16 bf16, window 6") << what;
  auto ctx = cases::make_step_context(st, Hk, D, DType::f32, Device::cpu(), 5);
  const AttentionMetadata& md = ctx->metadata;
  const int64_t T = md.num_tokens();
  const Tensor q = cases::normal({T, H * D}, DType::f32, Device::cpu(), 7, "q", 1.0);
  const Tensor k = cases::normal({T, Hk * D}, DType::f32, Device::cpu(), 7, "k", 1.0);
  const Tensor v = cases::normal({T, Hk * D}, DType::f32, Device::cpu(), 7, "v", 1.0);
  Tensor out;
  {
    ForwardContextGuard guard({&md, &ctx->kv_caches});
    out = layer.forward(q, k, v);
  }
  const KVCache& cache = ctx->kv_caches[0];
  const Tensor q3 = q.view({T, H, D});
  const int64_t ns = md.num_prefills, nd = md.num_decodes;
  std::vector<Tensor> expected, plain;
  if (md.num_prefill_tokens > 0) {
    baseline::FlashAttnPrefill with(H, D, scale, Hk, W, cap), without(H, D, scale, Hk);
    const Tensor qp = q3.slice(0, 0, md.num_prefill_tokens).contiguous();
    const Tensor lens = md.seq_lens.slice(0, 0, ns), tables = md.block_tables.slice(0, 0, ns);
    expected.push_back(with.forward(qp, cache.key, cache.value, md.query_start_loc, lens, tables,
                                    md.max_prefill_query_len, md.max_prefill_seq_len, sinks));
    plain.push_back(without.forward(qp, cache.key, cache.value, md.query_start_loc, lens, tables,
                                    md.max_prefill_query_len, md.max_prefill_seq_len));
  }
  if (nd > 0) {
    baseline::FlashAttnDecode with(H, D, scale, Hk, W, cap), without(H, D, scale, Hk);
    const Tensor qd = q3.slice(0, md.num_prefill_tokens, T).contiguous();
    const Tensor lens = md.seq_lens.slice(0, ns, ns + nd), tables = md.block_tables.slice(0, ns, ns + nd);
    expected.push_back(with.forward(qd, cache.key, cache.value, lens, tables, md.max_decode_seq_len, sinks));
    plain.push_back(without.forward(qd, cache.key, cache.value, lens, tables, md.max_decode_seq_len));
  }
  std::vector<float> want, none;
  for (const Tensor& e : expected)
    for (float x : e.to_floats()) want.push_back(x);
  for (const Tensor& e : plain)
    for (float x : e.to_floats()) none.push_back(x);
  EXPECT_EQ(out.to_floats(), want) << what;
  EXPECT_NE(out.to_floats(), none) << what << ": the features made no difference";
}

TEST(AttentionLayerFeatures, PrefillAndDecodeStepsCarryWindowSoftCapAndSinks) {
  cases::StepShape prefill;
  prefill.query = {9, 4};
  prefill.cached = {0, 12};  // a chunked prefill after 12 cached tokens: its window starts inside the cache
  check_layer_features(prefill, "prefill");
  cases::StepShape decode;
  decode.decode = true;
  decode.query = {1, 1, 1};
  decode.cached = {20, 3, 40};
  check_layer_features(decode, "decode");
}

}  // namespace
}  // namespace kbn
