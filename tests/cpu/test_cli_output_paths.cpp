// Output paths are checked before any work: a missing folder, a folder given for a file, or a file given for a
// folder fails at once (exit 2, the flag and the path named), not after the run, and never silently.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_paths.h"
#include "test_process.h"

namespace {

namespace fs = std::filesystem;

// Runs kb_nano `args`; expects exit 2, `message` in the output, and `work` (a sign the run started) absent.
void expect_refused_before_work(const std::string& args, const std::string& message, const std::string& work) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const auto r = kbn::test::shell("KBN_MODELS_DIR=" KBN_SOURCE_DIR "/models " + exe + " " + args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find(work), std::string::npos) << args << " did work before refusing\n" << r.output;
}

}  // namespace

TEST(CliOutputPaths, GenerateJsonIntoMissingFolder) {
  expect_refused_before_work("generate --device cpu --model tiny-llama --max-new-tokens 2 --json /nonexistent_kbn/g.json",
                             "--json: cannot write '/nonexistent_kbn/g.json': the folder '/nonexistent_kbn' does not "
                             "exist",
                             "prompt 0");
}

TEST(CliOutputPaths, GenerateSaveLogitsIntoAFolder) {
  const fs::path dir = kbn::test::temp_dir("kbn_outpaths");
  expect_refused_before_work("generate --device cpu --model tiny-llama --max-new-tokens 2 --save-logits " + dir.string(),
                             "--save-logits: '" + dir.string() + "' is a folder", "prompt 0");
  fs::remove_all(dir);
}

TEST(CliOutputPaths, GenerateJsonIsWritten) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const fs::path dir = kbn::test::temp_dir("kbn_outpaths");
  const auto r = kbn::test::shell("KBN_MODELS_DIR=" KBN_SOURCE_DIR "/models " + exe +
                                  " generate --device cpu --model tiny-llama --max-new-tokens 2 --json " +
                                  (dir / "g.json").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(kbn::test::read_file((dir / "g.json").string()).find("\"tokens\""), std::string::npos);
  fs::remove_all(dir);
}

TEST(CliOutputPaths, EvalJsonBeforeTheRun) {
  expect_refused_before_work("eval --device cpu --num-requests 2 --json /nonexistent_kbn/e.json",
                             "--json: cannot write '/nonexistent_kbn/e.json'", "kb_nano eval: workload");
}

TEST(CliOutputPaths, KernelsJsonAndMarkdownBeforeTheCases) {
  expect_refused_before_work("kernels --device cpu --model tiny-llama --target rms_norm --random 0 --seeds 1 --json "
                             "/nonexistent_kbn/k.json",
                             "--json: cannot write '/nonexistent_kbn/k.json'", "Summary:");
  expect_refused_before_work("kernels --device cpu --model tiny-llama --target rms_norm --random 0 --seeds 1 "
                             "--markdown /nonexistent_kbn/k.md",
                             "--markdown: cannot write '/nonexistent_kbn/k.md'", "Summary:");
}

TEST(CliOutputPaths, ProfileOutputsBeforeReadingCaptures) {
  // The capture does not exist either: the output path is refused first.
  expect_refused_before_work("profile --from-csv /nonexistent_kbn/c.csv --markdown /nonexistent_kbn/p.md",
                             "--markdown: cannot write '/nonexistent_kbn/p.md'", "c.csv");
}

TEST(CliOutputPaths, ReportOutUnderAFileBeforeReadingResults) {
  const fs::path dir = kbn::test::temp_dir("kbn_outpaths");
  std::ofstream(dir / "plain") << "x";
  const std::string out = (dir / "plain" / "report").string();
  expect_refused_before_work("report --out " + out + " /nonexistent_kbn/r.json",
                             "--out: cannot create '" + out + "'", "r.json");
  fs::remove_all(dir);
}
