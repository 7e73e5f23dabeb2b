#include "engine/tp_group.h"

#include <exception>
#include <thread>

#include "kbn/error.h"
#include "kbn/parallel_state.h"

namespace kbn::engine {

TensorParallelGroup::TensorParallelGroup(int size, Device device) : device_(device) {
  KBN_CHECK(size >= 1, "--tp: the tensor-parallel size must be >= 1, got ", size);
  if (device.is_cpu()) {
    comms_ = make_cpu_group(size);
    return;
  }
  KBN_CHECK(size <= cuda_device_count(), "--tp ", size, ": needs ", size, " GPUs (rank r on cuda:r), but ",
            cuda_device_count(), " are visible");
  std::vector<int> devices;
  for (int r = 0; r < size; ++r) devices.push_back(r);
  comms_ = make_nccl_group(devices);
}

TensorParallelGroup::~TensorParallelGroup() = default;

Device TensorParallelGroup::device_of(int rank) const {
  return device_.is_cpu() ? Device::cpu() : Device::cuda(rank);
}

void TensorParallelGroup::run(const std::function<void(int rank)>& fn) {
  const int n = size();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([this, r, n, &fn, &errors] {
      try {
        set_parallel_state({r, n, comms_[size_t(r)].get()});
        const Device d = device_of(r);
        const DeviceGuard on_device(d);  // the thread's current device for everything it allocates and launches
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        std::string why = "rank " + std::to_string(r) + " failed";
        try {
          throw;
        } catch (const std::exception& e) {
          why += ": " + std::string(e.what());
        } catch (...) {
        }
        for (auto& c : comms_) c->abort(why);
      }
    });
  }
  for (auto& t : threads) t.join();
  // The rank that failed first in rank order, preferring an original error over "the group was aborted".
  std::exception_ptr first;
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (std::string(ex.what()).find("the group was aborted") == std::string::npos) std::rethrow_exception(e);
      if (!first) first = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace kbn::engine
