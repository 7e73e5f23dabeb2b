#pragma once
// Where the tests find their data: $KBN_FIXTURE_DIR when set (a test binary carried to another machine),
// else the source tree it was built from.
#include <cstdlib>
#include <string>

namespace kbn::test {
inline std::string fixture_dir() {
  const char* env = std::getenv("KBN_FIXTURE_DIR");
  return env ? env : KBN_FIXTURE_DIR;
}
}  // namespace kbn::test
