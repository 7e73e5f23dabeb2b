#pragma once
// Running the built kb_nano from a CPU test: a fresh temporary folder, a shell command's exit code and
// output, and the kb_nano next to the test binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kbn::test {

// A new folder under the system temp directory, named after `prefix`.
inline std::filesystem::path temp_dir(const std::string& prefix) {
  std::string templ = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

struct ShellResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

inline ShellResult shell(const std::string& command) {
  ShellResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The kb_nano built next to this test binary (build/tests/kbn_tests -> build/kb_nano), or "" when absent.
inline std::string kb_nano() {
  const std::filesystem::path p =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "kb_nano";
  return std::filesystem::exists(p) ? p.string() : "";
}

}  // namespace kbn::test
