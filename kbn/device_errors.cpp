#include "kbn/device_errors.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "kbn/error.h"
#ifdef KBN_WITH_CUDA
#include <cuda_runtime.h>

#include "kbn/cuda_check.h"
#endif

namespace kbn {
namespace {

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& messages() {  // code c is messages()[c - 1]
  static std::vector<std::string> m;
  return m;
}
std::atomic<DeviceErrorRecord*> allocated{nullptr};  // set once a kernel path has asked for the record

}  // namespace

DeviceErrorRecord* device_error_record() {
#ifdef KBN_WITH_CUDA
  static DeviceErrorRecord* record = [] {
    void* p = nullptr;
    KBN_CUDA_CHECK(cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    auto* r = static_cast<DeviceErrorRecord*>(p);
    *r = DeviceErrorRecord{0, 0, 0};
    allocated.store(r);
    return r;  // lives for the process
  }();
  return record;
#else
  return nullptr;
#endif
}

int32_t device_error_code(const std::string& message) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& m = messages();
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] == message) return int32_t(i + 1);
  m.push_back(message);
  return int32_t(m.size());
}

void check_device_errors() {
#ifdef KBN_WITH_CUDA
  volatile DeviceErrorRecord* r = allocated.load();  // no record yet: no kernel could have written one
  if (!r) return;
  const int32_t code = r->code;
  if (code == 0) return;
  const int64_t detail = r->detail;
  r->code = 0;
  r->detail = 0;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    const auto& m = messages();
    message = code >= 1 && size_t(code) <= m.size() ? m[size_t(code) - 1]
                                                     : "a kernel recorded unknown error code " + std::to_string(code);
  }
  const std::string key = "{detail}";
  if (const size_t at = message.find(key); at != std::string::npos) message.replace(at, key.size(), std::to_string(detail));
  KBN_FAIL(message);
#endif
}

}  // namespace kbn
