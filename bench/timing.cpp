#include "bench/timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kbn/device.h"
#include "kbn/error.h"
#include "kbn/format.h"
#ifdef KBN_WITH_CUDA
#include "bench/cuda_events.h"
#include "bench/l2_flush.h"
#include "bench/spin.h"
#include "kbn/cuda_check.h"
#endif

namespace kbn::bench {

TimingMode parse_timing_mode(const std::string& s) {
  if (s == "cold") return TimingMode::cold;
  if (s == "hot") return TimingMode::hot;
  if (s == "graph") return TimingMode::graph;
  KBN_FAIL("--mode: expected cold, hot or graph, got '", s, "'");
}

const char* timing_mode_name(TimingMode m) {
  switch (m) {
    case TimingMode::cold:
      return "cold";
    case TimingMode::hot:
      return "hot";
    case TimingMode::graph:
      return "graph";
  }
  return "?";
}

int cold_input_sets(long long input_set_bytes, long long l2_bytes) {
  constexpr int kMaxSets = 16;
  constexpr long long kMaxBytes = 8LL << 30;
  if (input_set_bytes <= 0) return 1;
  const long long wanted = 3 * l2_bytes / input_set_bytes + 1;  // total strictly above 3x L2
  const long long by_memory = std::max(1LL, kMaxBytes / input_set_bytes);
  return int(std::max(1LL, std::min({wanted, by_memory, (long long)kMaxSets})));
}

std::string case_does_not_fit(long long input_set_bytes, int sets, long long device_bytes) {
  const double need = double(input_set_bytes) * sets;
  if (device_bytes <= 0 || need <= 0.9 * double(device_bytes)) return "";
  constexpr double kGiB = double(1ll << 30);
  return "does not fit: " + std::to_string(sets) + " input sets of " + fmt("%.1f", double(input_set_bytes) / kGiB) +
         " GiB held at once need " + fmt("%.1f", need / kGiB) + " GiB, more than 90% of the device's " +
         fmt("%.1f", double(device_bytes) / kGiB) + " GiB";
}

namespace {

double percentile(const std::vector<double>& sorted, double q) {
  const size_t i = size_t(std::lround(q * double(sorted.size() - 1)));
  return sorted[std::min(i, sorted.size() - 1)];
}

void summarise(Timing& t, std::vector<double> per_call_ms, std::vector<double> wall_ms) {
  std::sort(per_call_ms.begin(), per_call_ms.end());
  std::sort(wall_ms.begin(), wall_ms.end());
  t.ok = true;
  t.iterations = int(per_call_ms.size());
  t.median_ms = percentile(per_call_ms, 0.5);
  t.min_ms = per_call_ms.front();
  t.p10_ms = percentile(per_call_ms, 0.1);
  t.p90_ms = percentile(per_call_ms, 0.9);
  t.host_wall_median_ms = percentile(wall_ms, 0.5);
}

bool keep_going(int iterations, double measured_ms, const TimingOptions& o) {
  if (iterations < o.min_iterations) return true;
  return measured_ms < o.min_measured_ms && iterations < o.max_iterations;
}

Timing time_host(const TimedOp& op, const TimingOptions& o) {
  Timing t;
  t.input_sets = op.input_sets;
  for (int i = 0; i < o.warmup_calls; ++i) op.call(i % op.input_sets);
  std::vector<double> ms;
  double measured = 0;
  for (int it = 0; keep_going(it, measured, o); ++it) {
    const int set = it % op.input_sets;
    if (op.refresh) op.refresh(set, it);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> out = op.call(set);
    const double m = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (op.observe) op.observe(set, it, out);
    ms.push_back(m);
    measured += m;
  }
  summarise(t, ms, ms);  // on the host clock, per call and wall time are the same measurement
  return t;
}

}  // namespace

#ifdef KBN_WITH_CUDA
namespace {

constexpr size_t kFlushBytes = size_t(256) << 20;

struct OwnedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  OwnedGraph() = default;
  ~OwnedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  OwnedGraph(const OwnedGraph&) = delete;
  OwnedGraph& operator=(const OwnedGraph&) = delete;
};

struct Iteration {
  double stream_ms = 0;       // start -> end event on the bench stream
  double device_wide_ms = 0;  // start event -> an event recorded after cudaDeviceSynchronize returned
  double wall_ms = 0;         // host clock around the whole iteration
};

// One timed iteration: `enqueue` between the events on `stream`, then a device-wide sync before reading.
template <class Enqueue>
Iteration timed_iteration(cudaStream_t stream, const EventPair& ev, cudaEvent_t after_sync, Enqueue enqueue) {
  const auto wall_start = std::chrono::steady_clock::now();
  KBN_CUDA_CHECK(cudaEventRecord(ev.start, stream));
  enqueue();
  KBN_CUDA_CHECK(cudaEventRecord(ev.end, stream));
  // NOTE: a device-wide sync, not a stream sync: work the call left on other streams or threads finishes here,
  // before the next iteration starts. The event recorded after it measures that work (device-wide time).
  KBN_CUDA_CHECK(cudaDeviceSynchronize());
  KBN_CUDA_CHECK(cudaEventRecord(after_sync, stream));
  KBN_CUDA_CHECK(cudaEventSynchronize(after_sync));
  const auto wall_end = std::chrono::steady_clock::now();
  float ms = 0, all = 0;
  KBN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.end));
  KBN_CUDA_CHECK(cudaEventElapsedTime(&all, ev.start, after_sync));
  return {double(ms), double(all), std::chrono::duration<double, std::milli>(wall_end - wall_start).count()};
}

struct OwnedEvent {
  cudaEvent_t e = nullptr;
  OwnedEvent() { KBN_CUDA_CHECK(cudaEventCreate(&e)); }
  ~OwnedEvent() { cudaEventDestroy(e); }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
};

// Median of (device-wide - stream) time of an iteration whose only work is a spin of `busy_ms` on the bench
// stream (0: an empty iteration): the host round trip of the sync and the last event, subtracted before judging a
// call's work outside the bench stream. The round trip depends on how long the host waited: a sync that waits
// tens of microseconds stops spinning and is woken later than one that returns at once (measured on the H200:
// about 9 us more at a 75 us call), so the gap a call is judged against comes from a spin as long as the call.
// `before` enqueues what a timed iteration enqueues ahead of its start event (the cold-L2 flush), so that the host
// waits as long as it does in one.
template <class Before = void (*)()>
double sync_overhead_ms(cudaStream_t stream, const EventPair& ev, cudaEvent_t after_sync, double busy_ms,
                        Before before = [] {}) {
  std::vector<double> gaps;
  for (int i = 0; i < 21; ++i) {
    before();
    const Iteration it = timed_iteration(stream, ev, after_sync, [&] {
      if (busy_ms > 0) spin_on_device(busy_ms, stream);
    });
    gaps.push_back(it.device_wide_ms - it.stream_ms);
  }
  std::sort(gaps.begin(), gaps.end());
  return gaps[gaps.size() / 2];
}

Timing time_eager(const TimedOp& op, const TimingOptions& o) {
  Timing t;
  const int input_sets = op.input_sets;
  t.input_sets = input_sets;
  const bool cold = o.mode == TimingMode::cold;
  const cudaStream_t stream = current_stream();
  EventPair ev;
  OwnedEvent after_sync;
  std::unique_ptr<DeviceBuffer> flush;
  uint32_t* flush_sink = nullptr;  // the flush kernel's output: the buffer's last 16 bytes, which it does not read
  if (cold) {
    flush = std::make_unique<DeviceBuffer>(kFlushBytes);
    flush_sink = reinterpret_cast<uint32_t*>(static_cast<char*>(flush->ptr) + kFlushBytes - 16);
  }

  for (int i = 0; i < o.warmup_calls; ++i) op.call(i % input_sets);
  KBN_CUDA_CHECK(cudaDeviceSynchronize());
  t.empty_round_trip_ms = sync_overhead_ms(stream, ev, after_sync.e, 0);

  std::vector<double> per_call, wall, outside;
  double measured = 0;
  for (int it = 0; keep_going(it, measured, o); ++it) {
    const int set = it % input_sets;
    // NOTE: new values first, then the flush, both enqueued before the start event, so neither is timed and the
    // flush also evicts the freshly written inputs (l2_flush.h: why it reads).
    if (op.refresh) op.refresh(set, it);
    if (cold) flush_l2_by_reading(flush->ptr, kFlushBytes - 16, flush_sink, stream);
    std::vector<Tensor> out;
    const Iteration r = timed_iteration(stream, ev, after_sync.e, [&] { out = op.call(set); });
    if (op.observe) op.observe(set, it, out);
    per_call.push_back(r.stream_ms);
    wall.push_back(r.wall_ms);
    outside.push_back(r.device_wide_ms - r.stream_ms);
    measured += r.stream_ms;
  }
  summarise(t, std::move(per_call), std::move(wall));
  std::sort(outside.begin(), outside.end());
  const double overhead = sync_overhead_ms(stream, ev, after_sync.e, t.median_ms, [&] {
    if (cold) flush_l2_by_reading(flush->ptr, kFlushBytes - 16, flush_sink, stream);
  });
  t.outside_stream_ms = std::max(0.0, percentile(outside, 0.5) - overhead);
  return t;
}

Timing time_graph(const TimedOp& op, const TimingOptions& o) {
  Timing t;
  const int input_sets = op.input_sets;
  t.input_sets = input_sets;
  KBN_CUDA_CHECK(cudaDeviceSynchronize());
  int device = 0;
  KBN_CUDA_CHECK(cudaGetDevice(&device));
  const OwnedStream capture_stream(Device::cuda(device));
  const cudaStream_t stream = capture_stream.get();
  StreamGuard guard(stream);
  // Warm-up on the capture stream itself: per-stream workspaces (cuBLASLt) and cached output blocks exist
  // before capture, so the captured calls allocate nothing new.
  for (int i = 0; i < o.warmup_calls; ++i) op.call(i % input_sets);
  KBN_CUDA_CHECK(cudaDeviceSynchronize());

  OwnedGraph g;
  // The captured calls' outputs stay allocated (held here), so every replay writes them again and each can be
  // observed after a launch.
  std::vector<std::vector<Tensor>> captured;
  KBN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < o.graph_calls; ++i) captured.push_back(op.call(i % input_sets));
  } catch (const Error& e) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();  // clear the capture error so later cases run
    t.skipped = std::string("graph: capture failed: ") + e.what();
    return t;
  }
  KBN_CUDA_CHECK(cudaStreamEndCapture(stream, &g.graph));
  KBN_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  KBN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));  // warm-up launch (uploads the graph)
  KBN_CUDA_CHECK(cudaDeviceSynchronize());

  EventPair ev;
  OwnedEvent after_sync;
  t.empty_round_trip_ms = sync_overhead_ms(stream, ev, after_sync.e, 0);
  std::vector<double> per_call, wall, outside;
  double measured = 0;
  const double n = double(o.graph_calls);
  for (int it = 0; keep_going(it, measured, o); ++it) {
    const int64_t first_call = int64_t(it) * o.graph_calls;
    // NOTE: each set is refreshed once per launch; a set holds the values of its refresh for every captured call
    // that uses it, so graph mode gets its own input set per captured call where memory allows (kernels.cpp).
    if (op.refresh)
      for (int s = 0; s < std::min(input_sets, o.graph_calls); ++s) op.refresh(s, first_call + s);
    const Iteration r =
        timed_iteration(stream, ev, after_sync.e, [&] { KBN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream)); });
    if (op.observe)
      for (int i = 0; i < o.graph_calls; ++i) op.observe(i % input_sets, first_call + i, captured[size_t(i)]);
    per_call.push_back(r.stream_ms / n);
    wall.push_back(r.wall_ms / n);
    outside.push_back(r.device_wide_ms - r.stream_ms);
    measured += r.stream_ms;
  }
  summarise(t, std::move(per_call), std::move(wall));
  std::sort(outside.begin(), outside.end());
  const double overhead = sync_overhead_ms(stream, ev, after_sync.e, t.median_ms * n);
  t.outside_stream_ms = std::max(0.0, percentile(outside, 0.5) - overhead) / n;
  return t;
}

}  // namespace

Timing time_op(const TimedOp& op, const TimingOptions& options) {
  KBN_CHECK(op.input_sets >= 1, "bench: time_op needs at least one input set, got ", op.input_sets);
  KBN_CHECK(bool(op.call), "bench: time_op needs a call");
  if (options.host) return time_host(op, options);
  if (options.mode == TimingMode::graph) {
    if (!op.capturable) {
      Timing t;
      t.skipped = "graph: n/a";
      t.input_sets = op.input_sets;
      return t;
    }
    return time_graph(op, options);
  }
  return time_eager(op, options);
}

#else

Timing time_op(const TimedOp& op, const TimingOptions& options) {
  KBN_CHECK(op.input_sets >= 1, "bench: time_op needs at least one input set, got ", op.input_sets);
  if (options.host) return time_host(op, options);
  KBN_FAIL("kb_nano kernels times CUDA kernels; this binary was built without CUDA");
}

#endif

Timing time_op(const std::function<void(int)>& call, int input_sets, bool capturable, const TimingOptions& options) {
  TimedOp op;
  op.input_sets = input_sets;
  op.capturable = capturable;
  op.call = [&call](int set) {
    call(set);
    return std::vector<Tensor>{};
  };
  return time_op(op, options);
}

}  // namespace kbn::bench
