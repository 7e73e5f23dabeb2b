#pragma once
// Errors: every refusal names the argument, what was expected and what was found.
#include <sstream>
#include <stdexcept>
#include <string>

namespace kbn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace kbn

// KBN_FAIL("rms_norm: argument 'x' must be 2-D, got ", x.str());
#define KBN_FAIL(...) ::kbn::detail::throw_error(__FILE__, __LINE__, ::kbn::detail::concat(__VA_ARGS__))
#define KBN_CHECK(cond, ...)            \
  do {                                  \
    if (!(cond)) KBN_FAIL(__VA_ARGS__); \
  } while (0)
