#pragma once
// The timing contract of `kb_nano kernels` (after FlashInfer's bench and the CUTLASS profiler).
//
// Per case: 3 warm-up calls, then timed iterations until >= 200 ms of measured time or 1000 iterations
// (at least 10). Each iteration brackets ONE call with CUDA events recorded on the current stream, then
// calls cudaDeviceSynchronize() before reading the events. Reported: median, p10 and p90 per call.
//
// What is counted: everything the call enqueues on the bench stream between the two events, and any gap
// in which that stream waits (for another stream it joins through an event, or for the host, e.g. a
// device-to-host copy inside the call).
// Work the call pushes to another stream or thread that the bench stream never waits for is not between the
// events. The device-wide sync after each iteration makes such work finish before the next iteration starts,
// and an event recorded after that sync measures it: Timing::outside_stream_ms is how long device work ran
// past the end event (net of the sync's own round trip, measured on iterations that keep the stream busy as long
// as the call: the host's wake-up from a long wait is part of that trip; bench/spin.h). kb_nano
// kernels FAILs a case whose outside time is more than that round trip and 10% of its time ("streams"). Every
// iteration also records the host wall time from before the start event to after the sync.
//
// Fresh values: before every timed call (and every graph launch) `refresh` writes new values into the input
// set the call is about to use, untimed, so no timed call ever sees input values (or an address holding
// values) that an earlier call saw; `observe` sees each timed call's outputs after the sync, untimed, where the
// harness keeps sampled calls for verification (a cache keyed on addresses or values is then either useless or
// wrong, and a wrong output is caught).
//
// Modes: cold (default) reads a 256 MiB flush buffer before each call (outside the events; l2_flush.h says why it
// reads rather than writes) and rotates among several input sets that together exceed 3x the L2 size; hot skips both; graph
// captures 20 calls into a CUDA graph on a non-default stream and reports the graph's time / 20.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kbn/tensor.h"

namespace kbn::bench {

enum class TimingMode { cold, hot, graph };
TimingMode parse_timing_mode(const std::string& s);  // the error names --mode and the accepted values
const char* timing_mode_name(TimingMode m);

struct TimingOptions {
  TimingMode mode = TimingMode::cold;
  int warmup_calls = 3;
  double min_measured_ms = 200.0;
  int max_iterations = 1000;
  int min_iterations = 10;
  int graph_calls = 20;  // calls captured per graph (graph mode)
  // Host timing for CPU ops (std::chrono around each call; no flush, no events): what `kb_nano kernels
  // --device cpu` uses to exercise the harness without a GPU. Not a performance claim about anything.
  bool host = false;
};

struct Timing {
  bool ok = false;
  std::string skipped;                           // why no time was taken (e.g. "graph: n/a"), when !ok
  double median_ms = 0, p10_ms = 0, p90_ms = 0;  // per call
  double min_ms = 0;                              // the fastest call
  double host_wall_median_ms = 0;                // per iteration (per graph launch / graph_calls in graph mode)
  // Device work per call that ended after the bench stream's end event (work left on another stream or
  // thread): median of (event after a device-wide sync - end event), minus the same gap for an
  // iteration that only spins on the bench stream for the median call's time. About 0 for a call whose work is all on
  // (or joined back into) the bench stream.
  double outside_stream_ms = 0;
  // That gap for an empty iteration (the sync's own round trip), measured in the same run: thresholds on
  // outside_stream_ms derive from it, never from a fixed figure. 0 on the host clock.
  double empty_round_trip_ms = 0;
  int iterations = 0;
  int input_sets = 1;
};

// Input sets needed for cold-L2 rotation: their total must exceed 3x the L2 size; at most 16 sets and 8 GiB.
int cold_input_sets(long long input_set_bytes, long long l2_bytes);

// Why a case whose `sets` input sets of `input_set_bytes` each cannot be held at once on a device of `device_bytes`
// is not run (more than 90% of the device: the rest is for outputs, weights, snapshots and allocator rounding);
// empty when it fits or the device size is unknown (<= 0).
std::string case_does_not_fit(long long input_set_bytes, int sets, long long device_bytes);

// What time_op runs. `call(set)` runs the op once on input set `set` (0 <= set < input_sets) and returns its
// outputs; `refresh(set, n)` (optional) writes new values into input set `set` before timed call `n` (graph mode:
// before each launch, n counting captured calls); `observe(set, n, outputs)` (optional) sees timed call n's
// outputs after the device-wide sync. Both run outside the timed window. `capturable` is false when the call does
// host work that a CUDA graph cannot hold (graph mode then reports "graph: n/a").
struct TimedOp {
  int input_sets = 1;
  std::function<std::vector<Tensor>(int set)> call;
  std::function<void(int set, int64_t n)> refresh;
  std::function<void(int set, int64_t n, const std::vector<Tensor>& outputs)> observe;
  bool capturable = true;
};

// Times `op` under the contract above; with options.host, on the host clock (works in every build), else it needs a
// CUDA build and a GPU.
Timing time_op(const TimedOp& op, const TimingOptions& options);
// The same for a call without outputs, refresh or observation (tests of the timing itself).
Timing time_op(const std::function<void(int set)>& call, int input_sets, bool capturable, const TimingOptions& options);

}  // namespace kbn::bench
