#include "engine/tp_group.h"

#include <string>

#include "kbn/error.h"
#include "kbn/parallel_state.h"

namespace kbn::engine {

TensorParallelGroup::TensorParallelGroup(int size, Device device) : device_(device) {
  KBN_CHECK(size >= 1, "--tp: the tensor-parallel size must be >= 1, got ", size);
  KBN_CHECK(device.is_cpu() || device.index == 0, "--tp ", size,
            ": rank r runs on cuda:r, so the device must be cpu or cuda:0, got ", device.str());
  if (device.is_cpu()) {
    comms_ = make_cpu_group(size);
  } else {
    KBN_CHECK(size <= cuda_device_count(), "--tp ", size, ": needs ", size, " GPUs (rank r on cuda:r), but ",
              cuda_device_count(), " are visible");
    std::vector<int> devices;
    for (int r = 0; r < size; ++r) devices.push_back(r);
    comms_ = make_nccl_group(devices);
  }
  errors_.resize(size_t(size));
  for (int r = 0; r < size; ++r) threads_.emplace_back([this, r] { worker(r); });
}

TensorParallelGroup::~TensorParallelGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  job_ready_.notify_all();
  for (auto& t : threads_) t.join();
}

Device TensorParallelGroup::device_of(int rank) const {
  return device_.is_cpu() ? Device::cpu() : Device::cuda(rank);
}

namespace {

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void TensorParallelGroup::worker(int rank) {
  // The rank's state, once for the thread's life: its place in the group and its current device. A device
  // that cannot be selected fails every run of this rank.
  set_parallel_state({rank, size(), comms_[size_t(rank)].get()});
  std::unique_ptr<DeviceGuard> on_device;
  std::exception_ptr setup_error;
  try {
    on_device = std::make_unique<DeviceGuard>(device_of(rank));
  } catch (...) {
    setup_error = std::current_exception();
  }
  int64_t seen = 0;
  while (true) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      job_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error = setup_error;
    if (!error) {
      try {
        (*job)(rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      // The first rank to fail is the one run() reports; it is recorded before the abort, so the ranks that
      // the abort releases (they throw "the group was aborted") always come second.
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (first_failure_ < 0) first_failure_ = rank;
      }
      const std::string why = "rank " + std::to_string(rank) + " failed: " + describe(error);
      for (auto& c : comms_) c->abort(why);
    }
    std::lock_guard<std::mutex> lock(mu_);
    errors_[size_t(rank)] = error;
    if (++finished_ == size()) job_done_.notify_all();
  }
}

void TensorParallelGroup::run(const std::function<void(int rank)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  finished_ = 0;
  first_failure_ = -1;
  ++generation_;
  job_ready_.notify_all();
  job_done_.wait(lock, [&] { return finished_ == size(); });
  job_ = nullptr;
  if (first_failure_ >= 0) std::rethrow_exception(errors_[size_t(first_failure_)]);
}

}  // namespace kbn::engine
