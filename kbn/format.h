#pragma once
// Text helpers shared by the commands that write results (kernels, eval, profile, report).
#include <cstdio>
#include <ctime>
#include <string>

namespace kbn {

// printf-style formatting of one number, e.g. fmt("%.1f", 3.14159) == "3.1".
inline std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The current UTC time as ISO 8601 ("2026-11-30T01:23:27Z"), the date stamped into results.
inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace kbn
