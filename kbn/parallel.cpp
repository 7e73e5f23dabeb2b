#include "kbn/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "kbn/error.h"

namespace kbn {

namespace {
std::atomic<int> g_host_threads_override{0};
}  // namespace

void set_host_threads(int n) {
  KBN_CHECK(n >= 0 && n <= 4096, "set_host_threads: expected 0 (the default) or a count from 1 to 4096, got ", n);
  g_host_threads_override.store(n);
}

int host_threads() {
  if (const int o = g_host_threads_override.load(); o > 0) return o;
  static const int n = [] {
    if (const char* env = std::getenv("KBN_HOST_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      KBN_CHECK(end != env && *end == '\0' && v >= 1 && v <= 4096,
                "KBN_HOST_THREADS: expected an integer from 1 to 4096, got '", env, "'");
      return int(v);
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads = std::min<int64_t>(host_threads(), n / grain);
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto run = [&](int64_t t) {
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    try {
      fn(begin, end);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads - 1));
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kbn
