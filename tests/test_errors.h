#pragma once
// The message of the kbn::Error a call throws, for tests of error messages.
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "kbn/error.h"

namespace kbn::test {

// The message of the kbn::Error that fn throws; a test failure when it throws nothing or something else.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kbn::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected kbn::Error, nothing was thrown";
  return "";
}

}  // namespace kbn::test
