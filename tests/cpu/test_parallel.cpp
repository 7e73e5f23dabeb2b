// kbn::parallel_for: every iteration exactly once, small loops on the calling thread, errors rethrown.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kbn/parallel.h"
#include "kbn/rng.h"
#include "kbn/tensor.h"
#include "reference/reference.h"

namespace {

TEST(ParallelFor, CoversEveryIterationOnce) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000), int64_t(4097)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::mutex m;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    kbn::parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      {
        const std::lock_guard<std::mutex> lock(m);
        ranges.emplace_back(begin, end);
      }
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "n " << n << ", iteration " << i;
    if (n == 0) {
      EXPECT_TRUE(ranges.empty());
    }
    for (const auto& [b, e] : ranges) {
      EXPECT_LT(b, e) << "n " << n << ": an empty range was run";
    }
    EXPECT_LE(int64_t(ranges.size()), std::max<int64_t>(1, kbn::host_threads()));
  }
}

TEST(ParallelFor, FewerThanTwoGrainsRunOnTheCallingThread) {
  const std::thread::id me = std::this_thread::get_id();
  int calls = 0;
  kbn::parallel_for(99, 50, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 99);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ParallelFor, RethrowsAnErrorAfterEveryRangeRan) {
  std::atomic<int64_t> done{0};
  EXPECT_THROW(kbn::parallel_for(64, 1,
                                 [&](int64_t begin, int64_t end) {
                                   done += end - begin;
                                   if (begin == 0) throw std::runtime_error("range 0 failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(done.load(), 64);
}

TEST(ParallelFor, GrainKeepsSmallWorkOnOneThread) {
  EXPECT_EQ(kbn::grain_for(int64_t(1) << 30), 1);
  EXPECT_EQ(kbn::grain_for(1024), 1024);
  EXPECT_EQ(kbn::grain_for(0), int64_t(1) << 20);
}

// The oracle's threaded loops give the numbers of one thread, bit for bit (each output by one thread, in the serial
// order), at shapes large enough to split.
class HostThreads {
 public:
  explicit HostThreads(int n) { kbn::set_host_threads(n); }
  ~HostThreads() { kbn::set_host_threads(0); }
};

template <class Fn>
void expect_same_on_1_and_4_threads(Fn run) {
  kbn::Tensor one, four;
  {
    HostThreads t(1);
    one = run();
  }
  {
    HostThreads t(4);
    four = run();
  }
  const std::vector<double> a = one.to_doubles(), b = four.to_doubles();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

kbn::Tensor random_tensor(const kbn::Shape& shape, kbn::DType dt, uint64_t seed, double std = 1.0) {
  kbn::Tensor t = kbn::Tensor::empty(shape, dt);
  kbn::fill_normal_(t, seed, 0.0, std);
  return t;
}

TEST(ParallelOracle, HostRandomFillsMatchOneThread) {
  for (const int kind : {0, 1, 2}) {
    SCOPED_TRACE(kind);
    expect_same_on_1_and_4_threads([&] {
      kbn::Tensor t = kbn::Tensor::empty({1 << 18}, kind == 2 ? kbn::DType::i64 : kbn::DType::bf16);
      if (kind == 0) kbn::fill_normal_(t, 7, 0.0, 1.0);
      if (kind == 1) kbn::fill_uniform_(t, 7, -1.0, 1.0);
      if (kind == 2) kbn::fill_randint_(t, 7, 0, 1000);
      return t;
    });
  }
}

TEST(ParallelOracle, LinearAttentionAndExpertsMatchOneThread) {
  using kbn::DType;
  using kbn::Tensor;
  const Tensor x = random_tensor({48, 512}, DType::bf16, 1), w = random_tensor({256, 512}, DType::bf16, 2, 0.05);
  const Tensor bias = random_tensor({256}, DType::bf16, 3);
  expect_same_on_1_and_4_threads([&] {
    Tensor out = Tensor::empty({48, 256}, DType::f32);
    kbn::reference::linear(out, x, w, bias);
    return out;
  });

  // Two sequences over 16-slot pages: 40 new tokens after 60 cached, and 30 new tokens; 8 heads over 2 kv heads.
  const int64_t block = 16, heads = 8, kv_heads = 2, d = 64, blocks_per_seq = 7;
  const Tensor q = random_tensor({70, heads, d}, DType::bf16, 4);
  const Tensor kc = random_tensor({2 * blocks_per_seq, block, kv_heads, d}, DType::bf16, 5);
  const Tensor vc = random_tensor({2 * blocks_per_seq, block, kv_heads, d}, DType::bf16, 6);
  Tensor starts = Tensor::empty({3}, DType::i32), lens = Tensor::empty({2}, DType::i32);
  Tensor tables = Tensor::empty({2, blocks_per_seq}, DType::i32);
  starts.data<int32_t>()[0] = 0, starts.data<int32_t>()[1] = 40, starts.data<int32_t>()[2] = 70;
  lens.data<int32_t>()[0] = 100, lens.data<int32_t>()[1] = 30;
  for (int64_t i = 0; i < 2 * blocks_per_seq; ++i) tables.data<int32_t>()[i] = int32_t(2 * blocks_per_seq - 1 - i);
  expect_same_on_1_and_4_threads([&] {
    Tensor out = Tensor::empty({70, heads, d}, DType::f32);
    kbn::reference::paged_attention_prefill(out, q, kc, vc, starts, lens, tables, 0.125);
    return out;
  });

  expect_same_on_1_and_4_threads([] { return kbn::reference::rope_cos_sin_cache(128, 4096, 500000.0, {}); });

  // 24 tokens, top 2 of 8 experts, hidden 256, inter 128.
  const int64_t tokens = 24, experts = 8, top_k = 2, hidden = 256, inter = 128;
  const Tensor hs = random_tensor({tokens, hidden}, DType::bf16, 7);
  const Tensor w13 = random_tensor({experts, 2 * inter, hidden}, DType::bf16, 8, 0.05);
  const Tensor w2 = random_tensor({experts, hidden, inter}, DType::bf16, 9, 0.05);
  Tensor weights = Tensor::empty({tokens, top_k}, DType::f32), ids = Tensor::empty({tokens, top_k}, DType::i32);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      ids.data<int32_t>()[t * top_k + j] = int32_t((t * 3 + j * 5) % experts);
      weights.data<float>()[t * top_k + j] = 0.25f + 0.5f * float(j);
    }
  expect_same_on_1_and_4_threads([&] {
    Tensor out = Tensor::empty({tokens, hidden}, DType::f32);
    kbn::reference::fused_experts(out, hs, w13, w2, weights, ids);
    return out;
  });
}

TEST(ParallelOracle, ScansAndLatentAttentionMatchOneThread) {
  using kbn::DType;
  using kbn::Tensor;
  // Mamba-2's two scans: 3 sequences of 40-200 tokens, 16 heads over 2 groups, head 16, state 32.
  const int64_t nh = 16, P = 16, G = 2, N = 32;
  const std::vector<int32_t> q = {0, 200, 240, 400};
  const int64_t T = q.back();
  const Tensor x = random_tensor({T, nh, P}, DType::f32, 11), dt = random_tensor({T, nh}, DType::f32, 12, 0.5);
  const Tensor B = random_tensor({T, G, N}, DType::f32, 13), C = random_tensor({T, G, N}, DType::f32, 14);
  Tensor A = random_tensor({nh}, DType::f32, 15);
  for (int64_t h = 0; h < nh; ++h) A.data<float>()[h] = -0.1f - 0.1f * float(h);
  const Tensor D = random_tensor({nh}, DType::f32, 16), dt_bias = random_tensor({nh}, DType::f32, 17, 0.3);
  const Tensor init = random_tensor({3, nh, P, N}, DType::f32, 18);
  const Tensor has_init = Tensor::from_i32({1, 0, 1}, {3}), starts = Tensor::from_i32(q, {4});
  for (const bool chunked : {false, true}) {
    for (const int part : {0, 1}) {  // the output, then the final states
      SCOPED_TRACE(std::string(chunked ? "ssd_chunked_scan" : "mamba_chunk_scan_combined") +
                   (part ? " states" : " out"));
      expect_same_on_1_and_4_threads([&] {
        Tensor y = Tensor::empty({T, nh, P}, DType::f32), fin = Tensor::empty({3, nh, P, N}, DType::f32);
        if (chunked)
          kbn::reference::ssd_chunked_scan(y, fin, x, dt, A, B, C, D, dt_bias, {}, init, has_init, starts, 64);
        else
          kbn::reference::mamba_chunk_scan_combined(y, fin, x, dt, A, B, C, D, dt_bias, {}, init, has_init, starts, 64);
        return part ? fin : y;
      });
    }
  }

  // MLA prefill: 16 pages of 16 latent rows (latent 64 + rope 16), 4 heads of no-rope 32 / value 32.
  const int64_t pages = 16, page = 16, L = 64, R = 16, H = 4, nope = 32, V = 32;
  const Tensor cache = random_tensor({pages, page, L + R}, DType::bf16, 19);
  const Tensor kv_b = random_tensor({H * (nope + V), L}, DType::bf16, 20, 0.1);
  const Tensor mq = random_tensor({50, H, nope + R}, DType::bf16, 21);
  const Tensor mstarts = Tensor::from_i32({0, 30, 50}, {3}), lens = Tensor::from_i32({100, 20}, {2});
  std::vector<int32_t> table(2 * 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  const Tensor tables = Tensor::from_i32(table, {2, 8});
  expect_same_on_1_and_4_threads([&] {
    Tensor out = Tensor::empty({50, H, V}, DType::f32);
    kbn::reference::mla_attention(out, mq, cache, kv_b, mstarts, lens, tables, 0.1);
    return out;
  });
}

}  // namespace
