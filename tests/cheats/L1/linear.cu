// A candidate linear for the harness's cheat corpus (tests/cheats/README.md): an honest candidate that runs the
// baseline's GEMM, and five shortcuts selected by the KBN_CHEAT environment variable (any other value, rms_norm's
// cheat names included, is honest). One build serves them all. Each shortcut gets past a harness that keeps its
// inputs' values still between timed calls and runs the baseline and the candidate in one process;
// `kb_nano kernels` must FAIL each one with the check named in the README.
#include "L1/linear.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kbn/checks.h"
#include "kbn/device.h"
#include "kbn/registry.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

// The baseline's class, declared as tasks/baseline/L1/linear.h declares it (that header is this variant's here):
// the honest path and every shortcut's real work link to the baseline's forward.
namespace kbn::baseline {
class Linear : public Module {
 public:
  Linear() = default;
  Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias);
};
}  // namespace kbn::baseline

namespace kbn::KBN_VARIANT {

namespace {

// KBN_CHEAT unset or "honest" (or any name this file does not know, such as rms_norm's cheats) is the correct
// candidate; the names below are the shortcuts.
std::string cheat() {
  const char* v = std::getenv("KBN_CHEAT");
  return v ? v : "honest";
}

const void* ptr_of(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// out = x @ weight^T + bias by the baseline's implementation (cuBLASLt / GEMV on the GPU, the reference on the
// CPU), on the calling thread's current stream. Leaked: stateless, and never destroyed after the CUDA runtime.
Tensor baseline_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  static baseline::Linear& op = *new baseline::Linear();
  return op.forward(x, weight, bias);
}

// ---- address_cache ----
// Remembers the output of each (x, weight, bias) address and shape. From a key's third sighting on, it computes
// only the first 80% of the rows and serves the rest from the stored output: correct while the buffers keep their
// values, stale rows once the harness writes new values into the same buffers (caught by `timed outputs`, or by
// `fresh output` / `tolerance` where validation reuses an address with other values).
using CacheKey = std::tuple<const void*, const void*, const void*, int64_t, int64_t, int64_t>;
struct CacheSlot {
  int sightings = 0;
  Tensor out;  // a copy of the last full output for this key
};

Tensor address_cache_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  static auto& slots = *new std::map<CacheKey, CacheSlot>();
  static int64_t stored_bytes = 0;
  constexpr int64_t kMaxStoredBytes = int64_t(4) << 30;  // bounded: lm_head outputs at 4k tokens are ~1 GiB
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  CacheSlot& slot = slots[CacheKey{x.data_ptr(), weight.data_ptr(), ptr_of(bias), m, n, k}];
  ++slot.sightings;
  if (slot.sightings >= 3 && slot.out.defined() && m >= 2) {
    const int64_t m80 = std::max<int64_t>(1, m * 4 / 5);
    Tensor out = Tensor::empty({m, n}, x.dtype(), x.device());
    out.slice(0, 0, m80).copy_(baseline_linear(x.slice(0, 0, m80), weight, bias));
    out.slice(0, m80, m).copy_(slot.out.slice(0, m80, m));
    return out;
  }
  Tensor out = baseline_linear(x, weight, bias);
  if (!slot.out.defined()) stored_bytes += int64_t(out.nbytes());
  if (stored_bytes > kMaxStoredBytes) {
    for (auto& [key, s] : slots) s.out = Tensor();
    stored_bytes = int64_t(out.nbytes());
  }
  slot.out = out.clone();
  return out;
}

// ---- peek_baseline ----
// Wraps the baseline registry's "linear" entry so every baseline op the harness builds records its outputs, keyed
// by a fingerprint of x; the candidate then returns a copy of the baseline's output for the same x and does no GEMM.
// In one process where the harness calls the baseline before the candidate on equal inputs this passes; with the
// candidate in a worker process of its own nothing is recorded, and the empty output it returns instead is caught
// as `unwritten` (or `tolerance`).

// Device, dtype, shape and the bytes of up to the first and last 4 KiB of x (rows copied to the host as needed).
std::string fingerprint(const Tensor& x) {
  std::string s = x.device().str() + " " + dtype_name(x.dtype()) + shape_str(x.shape()) + "|";
  const int64_t m = x.size(0);
  if (m == 0) return s;
  constexpr int64_t kBytes = 4096;
  const int64_t row_bytes = std::max<int64_t>(1, x.size(1) * int64_t(x.element_size()));
  const int64_t rows = std::min(m, (kBytes + row_bytes - 1) / row_bytes);
  const Tensor head = x.slice(0, 0, rows).contiguous().to(Device::cpu());
  const Tensor tail = x.slice(0, m - rows, m).contiguous().to(Device::cpu());
  const int64_t hn = std::min<int64_t>(kBytes, int64_t(head.nbytes()));
  const int64_t tn = std::min<int64_t>(kBytes, int64_t(tail.nbytes()));
  s.append(static_cast<const char*>(head.data_ptr()), size_t(hn));
  s += "|";
  s.append(static_cast<const char*>(tail.data_ptr()) + (int64_t(tail.nbytes()) - tn), size_t(tn));
  return s;
}

struct PeekStore {
  std::mutex mutex;
  std::unordered_map<size_t, Tensor> outputs;  // std::hash of the fingerprint -> the baseline's output
  int64_t bytes = 0;
};
PeekStore& peek_store() {
  static auto& s = *new PeekStore();
  return s;
}

// The baseline op the harness builds, with every call's output recorded.
class RecordingOp : public AnyOp {
 public:
  explicit RecordingOp(std::unique_ptr<AnyOp> inner) : inner_(std::move(inner)) {}
  Module& module() override { return inner_->module(); }
  std::vector<Tensor> call(const std::vector<Tensor>& args) override {
    std::vector<Tensor> out = inner_->call(args);
    if (!args.empty() && args[0].defined() && args[0].dim() == 2 && !out.empty() && out[0].defined()) {
      const size_t key = std::hash<std::string>{}(fingerprint(args[0]));
      PeekStore& s = peek_store();
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.bytes > (int64_t(2) << 30)) {  // bounded: drop everything recorded so far
        s.outputs.clear();
        s.bytes = 0;
      }
      s.outputs[key] = out[0];  // the harness never writes into the baseline's outputs
      s.bytes += int64_t(out[0].nbytes());
    }
    return out;
  }

 private:
  std::unique_ptr<AnyOp> inner_;
};

// Patches the baseline registry (const to everyone else) once per process. Any failure leaves it unpatched: the
// cheat then finds nothing to copy.
void patch_baseline_registry() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      auto& reg = const_cast<Registry&>(registry(Variant::baseline));
      auto& entries = const_cast<std::vector<OpEntry>&>(reg.entries());
      for (OpEntry& e : entries) {
        if (e.name != "linear") continue;
        auto make = e.make;
        e.make = [make](const OpArgs& a) -> std::unique_ptr<AnyOp> {
          return std::make_unique<RecordingOp>(make(a));
        };
      }
    } catch (...) {
    }
  });
}

// Patches at static initialisation, before the harness builds its first baseline op. registry() holds its tables
// in function-local statics, so it is safe to call this early; forward patches again lazily in case it was not.
struct PeekInstaller {
  PeekInstaller() {
    if (cheat() == "peek_baseline") patch_baseline_registry();
  }
};
[[maybe_unused]] const PeekInstaller& peek_installer = *new PeekInstaller();

Tensor peek_baseline_forward(const Tensor& x, const Tensor& weight) {
  patch_baseline_registry();
  const size_t key = std::hash<std::string>{}(fingerprint(x));
  PeekStore& s = peek_store();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.outputs.find(key);
    if (it != s.outputs.end() && it->second.shape() == Shape{x.size(0), weight.size(0)}) return it->second.clone();
  }
  // Nothing to copy: an output that was never written (the harness poisons fresh allocations).
  return Tensor::empty({x.size(0), weight.size(0)}, x.dtype(), x.device());
}

// ---- prefetch_next ----
// Learns the order in which x buffers arrive (the timed loop rotates a few input sets). At the end of a call it
// snapshots the x expected next and computes that call's output in the background (a CPU thread; on the GPU a
// thread that enqueues the baseline GEMM on a side stream after ~30 us); the next call, if its x is at the
// predicted address, waits for that work and returns a copy. Its work happens between timed calls, on values read
// before the harness writes the next call's values: `timed outputs` sees the stale results.
struct PrefetchJob {
  const void* x_addr = nullptr;
  const void* weight_addr = nullptr;
  const void* bias_addr = nullptr;
  Shape x_shape, weight_shape;
  Tensor x_snapshot, weight, bias;  // the snapshot of the predicted x; the weight and bias handles of its call
  Tensor out;                       // written by the worker thread
  std::thread worker;
#ifdef KBN_WITH_CUDA
  cudaEvent_t ready = nullptr;  // the snapshot, on the caller's stream
  cudaEvent_t done = nullptr;   // the GEMM, on the side stream
#endif
};

struct SeenCall {
  const void* addr;
  Tensor x, weight, bias;
};

struct PrefetchState {
  std::map<const void*, const void*> next;  // x address -> the x address of the call that followed it last time
  std::deque<SeenCall> recent;              // handles of the last few calls' inputs, newest last
  const void* last = nullptr;
  std::unique_ptr<PrefetchJob> pending;
};

#ifdef KBN_WITH_CUDA
Stream side_stream(Device device) {
  static OwnedStream& s = *new OwnedStream(device);
  return s.get();
}
#endif

// Waits for the background work of `job` to be done from the caller's point of view (host join; on the GPU the
// caller's stream also waits for the side stream's GEMM).
void wait_for(PrefetchJob& job) {
  if (job.worker.joinable()) job.worker.join();
#ifdef KBN_WITH_CUDA
  if (job.done != nullptr) {
    KBN_CUDA_CHECK(cudaStreamWaitEvent(current_stream(), job.done, 0));
    KBN_CUDA_CHECK(cudaEventDestroy(job.done));
    job.done = nullptr;
  }
  if (job.ready != nullptr) {
    KBN_CUDA_CHECK(cudaEventDestroy(job.ready));
    job.ready = nullptr;
  }
#endif
}

std::unique_ptr<PrefetchJob> start_prefetch(const SeenCall& q) {
  auto job = std::make_unique<PrefetchJob>();
  job->x_addr = q.addr;
  job->weight_addr = q.weight.data_ptr();
  job->bias_addr = ptr_of(q.bias);
  job->x_shape = q.x.shape();
  job->weight_shape = q.weight.shape();
  job->x_snapshot = q.x.clone();  // synchronous on the CPU; stream-ordered on the caller's stream on the GPU
  job->weight = q.weight;
  job->bias = q.bias;
  PrefetchJob* j = job.get();
  if (q.x.is_cpu()) {
    j->worker = std::thread([j] {
      Tensor out = Tensor::empty({j->x_shape[0], j->weight_shape[0]}, j->x_snapshot.dtype(), Device::cpu());
      if (out.numel() > 0) reference::linear(out, j->x_snapshot, j->weight, j->bias);
      j->out = out;
    });
    return job;
  }
#ifdef KBN_WITH_CUDA
  const Device device = q.x.device();
  const Stream side = side_stream(device);
  KBN_CUDA_CHECK(cudaEventCreateWithFlags(&j->ready, cudaEventDisableTiming));
  KBN_CUDA_CHECK(cudaEventCreateWithFlags(&j->done, cudaEventDisableTiming));
  KBN_CUDA_CHECK(cudaEventRecord(j->ready, current_stream()));
  j->worker = std::thread([j, device, side] {
    DeviceGuard device_guard(device);
    std::this_thread::sleep_for(std::chrono::microseconds(30));
    StreamGuard stream_guard(side);
    KBN_CUDA_CHECK(cudaStreamWaitEvent(side, j->ready, 0));
    j->out = baseline_linear(j->x_snapshot, j->weight, j->bias);
    KBN_CUDA_CHECK(cudaEventRecord(j->done, side));
  });
#endif
  return job;
}

Tensor prefetch_next_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  static auto& st = *new PrefetchState();
  const void* p = x.data_ptr();
  Tensor out;
  // Kept alive until the next prefetch is enqueued, so its memory is not reused under the copy below.
  std::unique_ptr<PrefetchJob> used = std::move(st.pending);
  if (used) {
    wait_for(*used);
    if (used->x_addr == p && used->x_shape == x.shape() && used->weight_addr == weight.data_ptr() &&
        used->weight_shape == weight.shape() && used->bias_addr == ptr_of(bias) && used->out.defined())
      out = used->out.clone();
  }
  if (!out.defined()) out = baseline_linear(x, weight, bias);

  // Learn the order, remember this call's inputs, then prefetch the call expected next.
  if (st.last != nullptr) st.next[st.last] = p;
  if (st.next.size() > 4096) st.next.clear();
  st.last = p;
  for (auto it = st.recent.begin(); it != st.recent.end(); ++it)
    if (it->addr == p) {
      st.recent.erase(it);
      break;
    }
  st.recent.push_back({p, x, weight, bias});
  if (st.recent.size() > 8) st.recent.pop_front();
  auto nx = st.next.find(p);
  if (nx != st.next.end())
    for (const SeenCall& c : st.recent)
      if (c.addr == nx->second) {
        st.pending = start_prefetch(c);
        break;
      }
  used.reset();
  return out;
}

}  // namespace

// ---- op layer ----

Tensor Linear::forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const std::string mode = cheat();
  if (mode == "exit_zero") {
    // Ends the process with success before any check can fail: caught as `worker` (no answer came back).
    std::fflush(nullptr);
    std::_Exit(0);
  }
  if (mode == "hang") {
    // Never returns: caught as `worker` (no answer within --worker-timeout).
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // Shortcuts work on well-formed calls only; the baseline checks the arguments (and throws the usual errors).
  const bool well_formed = x.defined() && weight.defined() && x.dim() == 2 && weight.dim() == 2 &&
                           x.size(1) == weight.size(1) && x.device() == weight.device();
  if (!well_formed || (mode != "address_cache" && mode != "peek_baseline" && mode != "prefetch_next"))
    return baseline_linear(x, weight, bias);
  if (mode == "address_cache") return address_cache_forward(x, weight, bias);
  if (mode == "peek_baseline") return peek_baseline_forward(x, weight);
  return prefetch_next_forward(x, weight, bias);
}

}  // namespace kbn::KBN_VARIANT
