// The caching, stream-ordered CUDA allocator behind Tensor::empty.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <optional>

#include "kbn/allocator.h"
#include "kbn/tensor.h"

using namespace kbn;

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no GPU"

TEST(CudaAllocator, FreedBlocksAreReusedOnTheSameStream) {
  KBN_SKIP_WITHOUT_GPU();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
    first = t.data_ptr();
  }
  const AllocatorStats before = cuda_allocator_stats(0);
  Tensor again = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
  const AllocatorStats after = cuda_allocator_stats(0);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(after.num_device_mallocs, before.num_device_mallocs);
  EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1);
  EXPECT_GE(after.allocated_bytes, size_t(4) << 20);
}

TEST(CudaAllocator, BlocksDoNotMigrateAcrossStreams) {
  KBN_SKIP_WITHOUT_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* on_default = nullptr;
  {
    Tensor t = Tensor::empty({3 << 18}, DType::f32, Device::cuda(0));
    on_default = t.data_ptr();
  }
  {
    StreamGuard guard(s);
    Tensor t = Tensor::empty({3 << 18}, DType::f32, Device::cuda(0));
    // A block freed on the default stream may still be in use there; another stream must not get it.
    EXPECT_NE(t.data_ptr(), on_default);
  }
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

TEST(CudaAllocator, OutOfMemoryNamesTheRequest) {
  KBN_SKIP_WITHOUT_GPU();
  try {
    Tensor::empty({int64_t(1) << 46}, DType::u8, Device::cuda(0));  // 64 TiB
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("70368744177664"), std::string::npos) << e.what();
  }
  // The allocator stays usable after the failure.
  EXPECT_NO_THROW(Tensor::zeros({16}, DType::f32, Device::cuda(0)));
}

TEST(CudaTensor, CopiesFillsAndConversionsRoundTrip) {
  KBN_SKIP_WITHOUT_GPU();
  Tensor h = Tensor::from_floats({1.5f, -2.25f, 3.0f, 4.0f, 5.5f, -6.0f}, {2, 3});
  Tensor d = h.to(Device::cuda(0));
  EXPECT_EQ(d.to(Device::cpu()).to_floats(), h.to_floats());
  EXPECT_EQ(d.to(DType::bf16).to(DType::f32).to_floats(), h.to_floats());  // exact in bf16
  EXPECT_EQ(d.transpose(0, 1).contiguous().to_floats(), h.transpose(0, 1).contiguous().to_floats());
  d.slice(1, 1, 2).copy_(Tensor::full({2, 1}, 7.0, DType::f32, Device::cuda(0)));
  EXPECT_EQ(d.to_floats(), (std::vector<float>{1.5f, 7.0f, 3.0f, 4.0f, 7.0f, -6.0f}));
  Tensor z = Tensor::full({5}, 3.0, DType::f16, Device::cuda(0));
  EXPECT_EQ(z.to_floats(), std::vector<float>(5, 3.0f));
}

// A tensor that outlives the stream it was allocated on (a candidate caching its output across bench cases,
// each of which runs on its own OwnedStream) is freed later without touching the dead stream handle, both
// when the allocation was audited (poisoned, guarded) and when it was not; the block is then reusable on the
// legacy default stream only.
TEST(CudaAllocator, TensorsOutliveTheirOwnedStream) {
  KBN_SKIP_WITHOUT_GPU();
  for (const bool audited : {false, true}) {
    Tensor kept;
    {
      OwnedStream stream(Device::cuda(0));
      StreamGuard guard(stream.get());
      std::optional<AllocationAudit> audit;
      if (audited) audit.emplace();
      kept = Tensor::zeros({1 << 16}, DType::f32, Device::cuda(0));
      kept.fill_(2.0);
    }
    // A new stream that may reuse the dead handle's value must not be handed the kept block on free.
    OwnedStream other(Device::cuda(0));
    void* p = kept.data_ptr();
    EXPECT_EQ(kept.to(Device::cpu()).to_floats()[123], 2.0f) << "audited=" << audited;
    kept = Tensor();  // the free: must neither crash nor use the retired handle
    StreamGuard on_other(other.get());
    Tensor fresh = Tensor::empty({1 << 16}, DType::f32, Device::cuda(0));
    EXPECT_NE(fresh.data_ptr(), p) << "audited=" << audited;
  }
  EXPECT_TRUE(take_guard_violations().empty());
}

// The engine captures its decode graphs in thread-local mode, which forbids cudaMalloc; a tensor whose size
// the cache has no block for must still be allocatable inside the capture (the H200's long-context eval hit
// this), and the captured work must use it.
TEST(CudaAllocator, AllocatesInsideAThreadLocalCapture) {
  KBN_SKIP_WITHOUT_GPU();
  OwnedStream stream(Device::cuda(0));
  StreamGuard guard(stream.get());
  Tensor out = Tensor::zeros({1}, DType::f32, Device::cuda(0));
  const AllocatorStats before = cuda_allocator_stats(0);
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaGraph_t graph = nullptr;
  {
    Tensor t = Tensor::empty({(37 << 20) / 4 + 3}, DType::f32, Device::cuda(0));  // a size nothing else uses
    t.fill_(3.0);
    out.copy_(t.slice(0, 5, 6));
  }
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  EXPECT_GT(cuda_allocator_stats(0).num_device_mallocs, before.num_device_mallocs);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  EXPECT_EQ(out.to(Device::cpu()).to_floats()[0], 3.0f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
