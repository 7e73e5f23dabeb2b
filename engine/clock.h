#pragma once
// The engine's one clock: steady-clock seconds, the time base of arrivals, token times and step profiles.
#include <chrono>

namespace kbn::engine {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace kbn::engine
