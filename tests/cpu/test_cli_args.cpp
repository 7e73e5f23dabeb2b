// Bad command-line input gets an error naming the argument and what was expected, and a non-zero exit.
#include <gtest/gtest.h>

#include <string>

#include "test_paths.h"
#include "test_process.h"

namespace {

void expect_refused(const std::string& args, const std::string& message) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const auto r = kbn::test::shell("KBN_MODELS_DIR=" KBN_SOURCE_DIR "/models " + exe + " " + args);
  EXPECT_NE(r.code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
}

}  // namespace

TEST(CliArgs, KernelsGraphModeNeedsCuda) {
  expect_refused("kernels --device cpu --mode graph --target rms_norm --model tiny-llama --tokens 3",
                 "--mode graph: CUDA graphs need --device cuda");
}

TEST(CliArgs, TensorParallelSizes) {
  expect_refused("eval --device cpu --tp 0", "--tp: expected a tensor-parallel size >= 1, got 0");
  expect_refused("generate --device cpu --model tiny-llama --tp 3",
                 "num_heads: 4 is not divisible by the tensor-parallel size 3");
  expect_refused("generate --device cpu --model tiny-llama --tp 0", "--tp");
}
