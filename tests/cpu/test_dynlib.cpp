// Opening optional libraries at run time (kbn/dynlib.h): the environment variable is tried first, then the
// names, then the glob patterns; a failure names the variable and every place tried with the loader's reason.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "kbn/dynlib.h"

using namespace kbn;

TEST(Dynlib, OpensTheFirstCandidateThatLoadsAndFindsItsSymbols) {
  unsetenv("KBN_TEST_LIBRARY");
  void* h = open_library("the test needs libm", "KBN_TEST_LIBRARY", {"libkbn_does_not_exist.so", "libm.so.6"}, {},
                         RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  EXPECT_NE(library_symbol(h, "libm", "cos"), nullptr);
  try {
    library_symbol(h, "libm", "kbn_no_such_symbol");
    FAIL() << "a missing symbol was found";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("libm library lacks symbol kbn_no_such_symbol"), std::string::npos)
        << e.what();
  }
}

TEST(Dynlib, FailureNamesTheVariableAndEveryPlaceTried) {
  setenv("KBN_TEST_LIBRARY", "/nonexistent/libfromenv.so", 1);
  try {
    open_library("the test needs libnothing", "KBN_TEST_LIBRARY", {"libkbn_does_not_exist.so"},
                 {"/nonexistent/dir*/libnothing.so"}, RTLD_NOW);
    FAIL() << "a library that does not exist was opened";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the test needs libnothing, which could not be loaded; set KBN_TEST_LIBRARY to its path"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("\n  /nonexistent/libfromenv.so: "), std::string::npos) << m;  // the variable first
    EXPECT_LT(m.find("/nonexistent/libfromenv.so"), m.find("libkbn_does_not_exist.so")) << m;
  }
  unsetenv("KBN_TEST_LIBRARY");
}
