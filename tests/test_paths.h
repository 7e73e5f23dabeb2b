#pragma once
// Where the tests find their data: $KBN_FIXTURE_DIR when set (a test binary carried to another machine),
// else the source tree it was built from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace kbn::test {
inline std::string fixture_dir() {
  const char* env = std::getenv("KBN_FIXTURE_DIR");
  return env ? env : KBN_FIXTURE_DIR;
}

// A whole file as text (a failed expectation when it cannot be opened).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace kbn::test
