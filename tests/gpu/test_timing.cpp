// The timing contract of `kb_nano kernels` (bench/timing.h) on a real GPU: each mode times a device copy of a
// known size, graph mode agrees with hot mode, work left on another stream is measured as outside the bench
// stream, and a call that cannot be captured is reported as such.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <vector>

#include "bench/timing.h"
#include "kbn/device.h"
#include "kbn/tensor.h"

using namespace kbn;
using bench::TimingMode;

namespace {

#define KBN_SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no GPU"

constexpr int64_t kElems = 16 << 20;  // 64 MiB of f32 per buffer

struct CopySets {
  std::vector<Tensor> src, dst;
  explicit CopySets(int n) {
    for (int i = 0; i < n; ++i) {
      src.push_back(Tensor::full({kElems}, double(i + 1), DType::f32, Device::cuda(0)));
      dst.push_back(Tensor::zeros({kElems}, DType::f32, Device::cuda(0)));
    }
    synchronize(Device::cuda(0));
  }
};

bench::Timing time_copy(TimingMode mode, bool capturable = true) {
  const OwnedStream stream(Device::cuda(0));
  const StreamGuard guard(stream.get());
  CopySets sets(2);
  bench::TimingOptions o;
  o.mode = mode;
  o.min_measured_ms = 20;
  return bench::time_op([&](int s) { sets.dst[s].copy_(sets.src[s]); }, 2, capturable, o);
}

}  // namespace

TEST(Timing, EveryModeTimesACopyAtAPlausibleRate) {
  KBN_SKIP_WITHOUT_GPU();
  for (const TimingMode mode : {TimingMode::cold, TimingMode::hot, TimingMode::graph}) {
    const bench::Timing t = time_copy(mode);
    ASSERT_TRUE(t.ok) << bench::timing_mode_name(mode) << ": " << t.skipped;
    EXPECT_GE(t.iterations, 10) << bench::timing_mode_name(mode);
    EXPECT_LE(t.p10_ms, t.median_ms);
    EXPECT_LE(t.median_ms, t.p90_ms);
    // 128 MiB moved per call: between 0.5 and 20 TB/s covers every GPU this runs on (an H200 copies ~4.3).
    const double tb_per_s = 2.0 * kElems * 4 / (t.median_ms * 1e-3) / 1e12;
    EXPECT_GT(tb_per_s, 0.5) << bench::timing_mode_name(mode) << " " << t.median_ms << " ms";
    EXPECT_LT(tb_per_s, 20.0) << bench::timing_mode_name(mode) << " " << t.median_ms << " ms";
    EXPECT_LT(t.outside_stream_ms, 0.005) << bench::timing_mode_name(mode);
  }
}

TEST(Timing, GraphModeAgreesWithHotMode) {
  KBN_SKIP_WITHOUT_GPU();
  const bench::Timing hot = time_copy(TimingMode::hot), graph = time_copy(TimingMode::graph);
  ASSERT_TRUE(hot.ok && graph.ok) << graph.skipped;
  // A 30 us copy: the graph removes launch overhead, not work.
  EXPECT_GT(graph.median_ms, 0.7 * hot.median_ms);
  EXPECT_LT(graph.median_ms, 1.3 * hot.median_ms);
}

TEST(Timing, WorkLeftOnAnotherStreamIsMeasuredOutsideTheBenchStream) {
  KBN_SKIP_WITHOUT_GPU();
  const OwnedStream bench_stream(Device::cuda(0)), side(Device::cuda(0));
  const StreamGuard guard(bench_stream.get());
  CopySets sets(2);
  Tensor big_src = Tensor::full({kElems * 8}, 1.0, DType::f32, Device::cuda(0));
  Tensor big_dst = Tensor::zeros({kElems * 8}, DType::f32, Device::cuda(0));
  synchronize(Device::cuda(0));
  bench::TimingOptions o;
  o.mode = TimingMode::hot;
  o.min_measured_ms = 5;
  const bench::Timing t = bench::time_op(
      [&](int s) {
        sets.dst[s].copy_(sets.src[s]);
        // 512 MiB more on a stream the bench stream never waits for (~0.25 ms on an H200).
        ASSERT_EQ(cudaMemcpyAsync(big_dst.data_ptr(), big_src.data_ptr(), size_t(kElems) * 8 * 4,
                                  cudaMemcpyDeviceToDevice, side.get()),
                  cudaSuccess);
      },
      2, true, o);
  ASSERT_TRUE(t.ok);
  EXPECT_GT(t.outside_stream_ms, 0.05) << "median " << t.median_ms << " ms";
}

TEST(Timing, GraphModeReportsAnUncapturableCall) {
  KBN_SKIP_WITHOUT_GPU();
  const bench::Timing t = time_copy(TimingMode::graph, /*capturable=*/false);
  EXPECT_FALSE(t.ok);
  EXPECT_EQ(t.skipped, "graph: n/a");
}
