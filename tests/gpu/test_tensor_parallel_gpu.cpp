// Tensor parallelism over NCCL (needs 2+ GPUs; skipped otherwise): the collectives on bf16/f32 tensors (the
// peer-memory all-reduce for small ones, NCCL's for large ones), the peer all-reduce alone (sizes, repetition, CUDA
// graph replays), and the sharded tiny Llama on two GPUs against the same checkpoint on one.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include <cuda_runtime.h>

#include "engine/generate.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/comm.h"
#include "kbn/parallel_state.h"
#include "kbn/peer_all_reduce.h"
#include "test_paths.h"

using namespace kbn;

#define KBN_SKIP_WITHOUT_TWO_GPUS() \
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible"

TEST(NcclGroup, AllReduceAndAllGather) {
  KBN_SKIP_WITHOUT_TWO_GPUS();
  engine::TensorParallelGroup group(2, Device::cuda(0));
  for (const DType dt : {DType::f32, DType::bf16}) {
    std::vector<std::vector<float>> reduced(2), gathered(2);
    group.run([&](int rank) {
      Tensor x = Tensor::full({3, 1000}, 1.0 + rank, dt, Device::cuda(rank));  // the peer-memory kernel
      parallel_state().comm->all_reduce_sum(x);
      reduced[size_t(rank)] = x.to(Device::cpu()).to_floats();
      Tensor big = Tensor::full({300, 1000}, 1.0 + rank, dt, Device::cuda(rank));  // > 512 KiB: NCCL
      parallel_state().comm->all_reduce_sum(big);
      const std::vector<float> b = big.to(Device::cpu()).to_floats();
      EXPECT_EQ(b.front(), 3.0f);
      EXPECT_EQ(b.back(), 3.0f);
      Tensor y = Tensor::full({2, 7}, double(rank), dt, Device::cuda(rank));
      Tensor g = parallel_state().comm->all_gather(y);
      EXPECT_EQ(g.shape(), (Shape{2, 2, 7}));
      EXPECT_EQ(g.device(), Device::cuda(rank));
      gathered[size_t(rank)] = g.to(Device::cpu()).to_floats();
      synchronize(Device::cuda(rank));
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(reduced[size_t(r)][2999], 3.0f) << dtype_name(dt);
      EXPECT_EQ(gathered[size_t(r)][0], 0.0f) << dtype_name(dt);
      EXPECT_EQ(gathered[size_t(r)][20], 1.0f) << dtype_name(dt);
    }
  }
}

TEST(NcclGroup, ShardedTinyLlamaMatchesOneGpu) {
  KBN_SKIP_WITHOUT_TWO_GPUS();
  const engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  const std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, {100, 3, 9, 44, 12, 8, 1}};
  engine::GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.return_prompt_logits = true;
  auto single = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
  const engine::GenerateResult one =
      engine::generate_tokens(*single, prompts, Device::cuda(0), Variant::baseline, opt);

  engine::TensorParallelGroup group(2, Device::cuda(0));
  std::vector<engine::GenerateResult> tp(2);
  group.run([&](int rank) {
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, group.device_of(rank)}, 0);
    tp[size_t(rank)] = engine::generate_tokens(*model, prompts, group.device_of(rank), Variant::baseline, opt);
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tp[0].tokens[i], one.tokens[i]) << "prompt " << i;
    EXPECT_EQ(tp[1].tokens[i], one.tokens[i]) << "prompt " << i;
    const std::vector<float> a = tp[0].prompt_logits[i].to_floats(), b = one.prompt_logits[i].to_floats();
    ASSERT_EQ(a.size(), b.size());
    double max_err = 0;
    for (size_t k = 0; k < a.size(); ++k) max_err = std::max(max_err, double(std::fabs(a[k] - b[k])));
    EXPECT_LT(max_err, 1e-4) << "prompt " << i;
  }
}

namespace {

// Values that sum exactly in bf16: small integers depending on rank and index.
Tensor pattern(int64_t n, int rank, DType dt, Device d) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 7 + rank * 3) % 13) - 6.0f;
  return Tensor::from_floats(v, {n}, DType::f32).to(dt).to(d);
}

float expected(int64_t i, int ranks) {
  float s = 0;
  for (int r = 0; r < ranks; ++r) s += float((i * 7 + r * 3) % 13) - 6.0f;
  return s;
}

}  // namespace

TEST(PeerAllReduce, SumsEverySizeRepeatedlyAndUnderGraphReplays) {
  KBN_SKIP_WITHOUT_TWO_GPUS();
  std::vector<std::unique_ptr<PeerAllReduce>> peers = make_peer_all_reduce({0, 1}, kPeerAllReduceBytes);
  if (peers.empty()) GTEST_SKIP() << "cuda:0 and cuda:1 have no peer access";
  auto rank_main = [&](int rank) {
    const Device d = Device::cuda(rank);
    const DeviceGuard on(d);
    OwnedStream stream(d);
    const StreamGuard guard(stream.get());
    PeerAllReduce& ar = *peers[size_t(rank)];
    // Eager: sizes from one vector to the limit, each three times (both staging halves, the counters).
    for (const DType dt : {DType::f32, DType::bf16})
      for (const int64_t bytes : {int64_t(16), int64_t(8192), int64_t(8208), int64_t(100000), int64_t(kPeerAllReduceBytes)}) {
        const int64_t n = bytes / int64_t(dtype_size(dt));
        for (int rep = 0; rep < 3; ++rep) {
          Tensor x = pattern(n, rank, dt, d);
          ASSERT_TRUE(ar.accepts(x)) << x.str();
          ar.all_reduce_sum(x, stream.get());
          const std::vector<float> got = x.to(Device::cpu()).to_floats();
          for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 997))
            ASSERT_EQ(got[size_t(i)], expected(i, 2)) << dtype_name(dt) << " " << bytes << " B, index " << i;
          ASSERT_EQ(got.back(), expected(n - 1, 2)) << dtype_name(dt) << " " << bytes << " B";
        }
      }
    // What it refuses (the communicator then uses NCCL): too large, not whole 16-byte vectors, misaligned, CPU.
    EXPECT_FALSE(ar.accepts(Tensor::zeros({int64_t(kPeerAllReduceBytes) / 4 + 4}, DType::f32, d)));
    EXPECT_FALSE(ar.accepts(Tensor::zeros({7}, DType::bf16, d)));
    EXPECT_FALSE(ar.accepts(Tensor::zeros({17}, DType::bf16, d).slice(0, 1, 17)));
    EXPECT_FALSE(ar.accepts(Tensor::zeros({8}, DType::bf16, Device::cpu())));
    // A captured all-reduce replayed 40 times, with fresh input copied in before each replay.
    const int64_t n = 4096;
    Tensor buf = Tensor::zeros({n}, DType::bf16, d);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ar.all_reduce_sum(buf, stream.get());
    ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int rep = 0; rep < 40; ++rep) {
      Tensor in = pattern(n, rank + rep, DType::bf16, d);
      buf.copy_(in);
      ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
      const std::vector<float> got = buf.to(Device::cpu()).to_floats();
      for (int64_t i = 0; i < n; i += 61) {
        float want = 0;
        for (int r = 0; r < 2; ++r) want += float((i * 7 + (r + rep) * 3) % 13) - 6.0f;
        ASSERT_EQ(got[size_t(i)], want) << "replay " << rep << ", index " << i;
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  };
  // A rank that throws leaves its peer's next kernel waiting; that kernel traps after 10 s, so the test fails
  // instead of hanging.
  auto guarded = [&](int rank) {
    try {
      rank_main(rank);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  };
  std::thread t1(guarded, 1);
  guarded(0);
  t1.join();
}
