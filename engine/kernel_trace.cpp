#include "engine/kernel_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <queue>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "engine/clock.h"
#include "kbn/error.h"
#include "kbn/registry.h"

#ifdef KBN_WITH_CUDA
#include <cupti.h>
#include <dlfcn.h>

#include "kbn/device.h"
#include "kbn/dynlib.h"
#include "kbn/tensor.h"
#endif

namespace kbn::engine {

std::string kernel_op(const std::string& kernel_name) {
  std::string n = kernel_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  // The ops' own declared kernel names (OpEntry::kernels, in their facts files): the longest one the name
  // contains wins, so "rotary_embedding_kernel" is rotary's, not embedding's; ops declaring that same name share
  // the kernel (a fallback both attention ops launch).
  size_t best = 0;
  std::vector<std::string> owners;
  for (const auto& e : registry(Variant::baseline).entries()) {
    for (const auto& k : e.kernels) {
      if (k.size() < best || n.find(k) == std::string::npos) continue;
      if (k.size() > best) owners.clear();
      best = k.size();
      if (std::find(owners.begin(), owners.end(), e.name) == owners.end()) owners.push_back(e.name);
    }
  }
  if (owners.size() == 1) return owners.front();
  if (!owners.empty()) {
    std::sort(owners.begin(), owners.end());
    std::string s;
    for (const auto& o : owners) s += (s.empty() ? "" : " / ") + o;
    return s + " (shared kernel)";
  }
  // kb-nano's tensor library (kbn/), not an op.
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("strided_copy") || has("convert_kernel") || has("fill_kernel") || has("fill_random")) return "tensor copies and fills";
  return "other";
}

std::string short_kernel_name(const std::string& name) {
  std::string s = name;
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d) s = d;
  std::free(d);
  // "void ns::f<...>(Params)" -> "ns::f<...>": drop the parameter list (the parenthesis matching the final one;
  // "(anonymous namespace)" earlier in the name stays) and the return type.
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s = s.substr(0, i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  return s;
}

void KernelTraceBuilder::add(const std::string& name, int device, uint64_t start_ns, uint64_t end_ns) {
  KBN_CHECK(end_ns >= start_ns, "kernel trace: kernel '", name, "' ends (", end_ns, ") before it starts (", start_ns,
            ")");
  const auto it = by_name_.try_emplace(name).first;
  it->second.calls++;
  it->second.total_ns += end_ns - start_ns;
  intervals_[device].push_back({start_ns, end_ns, &it->first});
}

KernelTrace KernelTraceBuilder::finish(double wall_s) const {
  KernelTrace t;
  t.wall_s = wall_s;
  // Per device, sweep the kernels in start order: each stretch of busy time goes to the oldest kernel still running
  // (a min-heap by start; ended ones leave it when they reach the top), gaps to nobody; the busy time is the sum.
  std::map<const std::string*, uint64_t> attributed;
  for (const auto& [device, iv] : intervals_) {
    std::vector<Interval> v = iv;
    std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    const auto later = [](const Interval* a, const Interval* b) { return a->start > b->start; };
    std::priority_queue<const Interval*, std::vector<const Interval*>, decltype(later)> running(later);
    uint64_t busy = 0, now = 0;
    size_t next = 0;
    while (next < v.size() || !running.empty()) {
      while (!running.empty() && running.top()->end <= now) running.pop();
      if (running.empty()) {
        if (next == v.size()) break;
        now = std::max(now, v[next].start);  // idle until the next kernel starts
      }
      while (next < v.size() && v[next].start <= now) running.push(&v[next++]);
      while (!running.empty() && running.top()->end <= now) running.pop();
      if (running.empty()) continue;
      const Interval* oldest = running.top();
      const uint64_t until = std::min(oldest->end, next < v.size() ? v[next].start : UINT64_MAX);
      attributed[oldest->name] += until - now;
      busy += until - now;
      now = until;
    }
    t.busy_s[device] = double(busy) * 1e-9;
  }
  std::map<std::string, KernelStat> kernels, ops;
  for (const auto& [name, a] : by_name_) {
    const std::string shown = short_kernel_name(name), op = kernel_op(shown);
    const auto at = attributed.find(&name);
    const double attributed_s = at == attributed.end() ? 0.0 : double(at->second) * 1e-9;
    KernelStat& k = kernels[shown];
    k.name = shown;
    k.op = op;
    k.calls += a.calls;
    k.total_s += double(a.total_ns) * 1e-9;
    k.attributed_s += attributed_s;
    KernelStat& o = ops[op];
    o.name = o.op = op;
    o.calls += a.calls;
    o.total_s += double(a.total_ns) * 1e-9;
    o.attributed_s += attributed_s;
    t.kernels += a.calls;
    t.kernel_s += double(a.total_ns) * 1e-9;
  }
  auto sorted = [](std::map<std::string, KernelStat>& m) {
    std::vector<KernelStat> v;
    for (auto& [_, s] : m) v.push_back(s);
    std::stable_sort(v.begin(), v.end(), [](const KernelStat& a, const KernelStat& b) { return a.total_s > b.total_s; });
    return v;
  };
  t.by_kernel = sorted(kernels);
  t.by_op = sorted(ops);
  return t;
}

#ifdef KBN_WITH_CUDA

namespace {

struct CuptiApi {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

const CuptiApi& cupti() {
  static const CuptiApi api = [] {
    void* h = open_library("kernel tracing needs CUPTI (libcupti.so.13)", "KBN_CUPTI_LIBRARY",
                           {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                            "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13",
                            "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13"},
                           // pip's nvidia-cuda-cupti wheels (PyTorch's CUPTI).
                           {"/usr/local/lib/python3*/dist-packages/nvidia/cuda_cupti/lib/libcupti.so*",
                            "/usr/local/lib/python3*/site-packages/nvidia/cuda_cupti/lib/libcupti.so*",
                            "/usr/local/lib/python3*/dist-packages/nvidia/cu13/lib/libcupti.so*",
                            "/usr/local/lib/python3*/site-packages/nvidia/cu13/lib/libcupti.so*",
                            "/usr/lib/python3*/dist-packages/nvidia/cuda_cupti/lib/libcupti.so*"},
                           RTLD_NOW | RTLD_LOCAL);
    auto sym = [&](const char* name) { return library_symbol(h, "CUPTI", name); };
    CuptiApi a;
    a.register_callbacks = reinterpret_cast<decltype(a.register_callbacks)>(sym("cuptiActivityRegisterCallbacks"));
    a.enable = reinterpret_cast<decltype(a.enable)>(sym("cuptiActivityEnable"));
    a.disable = reinterpret_cast<decltype(a.disable)>(sym("cuptiActivityDisable"));
    a.flush_all = reinterpret_cast<decltype(a.flush_all)>(sym("cuptiActivityFlushAll"));
    a.next_record = reinterpret_cast<decltype(a.next_record)>(sym("cuptiActivityGetNextRecord"));
    a.result_string = reinterpret_cast<decltype(a.result_string)>(sym("cuptiGetResultString"));
    return a;
  }();
  return api;
}

void check_cupti(CUptiResult r, const char* call) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cupti().result_string(r, &msg);
  KBN_FAIL("kernel tracing: ", call, " failed: ", msg ? msg : "unknown CUPTI error");
}

// CUPTI's buffers are process-wide; so is what they fill.
std::mutex g_mu;
KernelTraceBuilder* g_builder = nullptr;  // non-null while a tracer runs
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity* record = nullptr;
    while (g_builder && cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      if (k->end >= k->start && k->name) g_builder->add(k->name, int(k->deviceId), k->start, k->end);
    }
  }
  std::free(buffer);
}

}  // namespace

KernelTracer::KernelTracer() {
  const CuptiApi& api = cupti();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    KBN_CHECK(g_builder == nullptr, "kernel tracing: another KernelTracer is running in this process");
    g_builder = new KernelTraceBuilder();
  }
  try {
    check_cupti(api.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check_cupti(api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  } catch (...) {
    std::lock_guard<std::mutex> lock(g_mu);
    delete g_builder;
    g_builder = nullptr;
    throw;
  }
  running_ = true;
  start_s_ = steady_seconds();
}

KernelTrace KernelTracer::stop() {
  KBN_CHECK(running_, "kernel tracing: stop() called twice");
  for (int d = 0; d < cuda_device_count(); ++d) synchronize(Device::cuda(d));
  const double wall = steady_seconds() - start_s_;
  running_ = false;
  check_cupti(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  check_cupti(cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  std::lock_guard<std::mutex> lock(g_mu);
  KernelTrace t = g_builder->finish(wall);
  delete g_builder;
  g_builder = nullptr;
  return t;
}

KernelTracer::~KernelTracer() {
  if (!running_) return;
  // Unwinding: stop collecting; what was recorded is dropped.
  cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_builder;
  g_builder = nullptr;
}

#else

KernelTracer::KernelTracer() { KBN_FAIL("kernel tracing needs a CUDA build (CUPTI); this binary is CPU-only"); }
KernelTracer::~KernelTracer() = default;
KernelTrace KernelTracer::stop() { KBN_FAIL("kernel tracing needs a CUDA build (CUPTI); this binary is CPU-only"); }

#endif

}  // namespace kbn::engine
