#pragma once
// Host-side data parallelism for the oracle's heavy loops (tasks/reference/): validating a real model's shapes
// multiplies and attends in doubles on the host, billions of multiply-adds per case (a 300-token Llama-3.1-8B QKV
// projection: 7.5 G). Each range's results are computed exactly as in a serial loop (every output element by one
// thread, in the same order), so the oracle's numbers do not depend on the thread count.
#include <cstdint>
#include <functional>

namespace kbn {

// The host threads parallel_for uses: KBN_HOST_THREADS (an integer >= 1) if set at the first call, else the
// hardware's count (at least 1).
int host_threads();

// Makes host_threads() return n (>= 1) from now on, or the default again (n = 0): for tests that compare thread
// counts.
void set_host_threads(int n);

// Runs fn(begin, end) over contiguous ranges covering [0, n) once each, on up to host_threads() threads (the calling
// thread takes one range), and returns when all have run; an exception thrown by fn is rethrown here (the first one,
// after every thread has finished). `grain` is the fewest iterations worth a thread of their own: a loop of fewer
// than 2 * grain iterations runs on the calling thread alone.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

// The grain for iterations of `work_per_iteration` operations each: about a million operations a thread at least.
inline int64_t grain_for(int64_t work_per_iteration) {
  constexpr int64_t kMinWorkPerThread = int64_t(1) << 20;
  if (work_per_iteration >= kMinWorkPerThread) return 1;
  return kMinWorkPerThread / (work_per_iteration > 0 ? work_per_iteration : 1);
}

}  // namespace kbn
