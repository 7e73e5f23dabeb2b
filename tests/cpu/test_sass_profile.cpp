// kb_nano profile --sass-csv without a GPU: the source-page parser, the synchronisation-point regions and the hot
// instructions, on a trimmed real capture (tests/fixtures/ncu/source_mla_decode_wgmma_trimmed.csv) and on
// hand-written pages for the edge cases; the CLI end to end with its JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/sass_profile.h"
#include "kbn/error.h"
#include "test_paths.h"
#include "test_process.h"

using namespace kbn;

namespace {

const std::string kCapture = "source_mla_decode_wgmma_trimmed.csv";

std::string fixture(const std::string& name) { return kbn::test::fixture_dir() + "/ncu/" + name; }

std::vector<bench::SassKernel> load_capture() {
  return bench::parse_ncu_source_csv(kbn::test::read_file(fixture(kCapture)));
}

// A two-kernel page in ncu's layout: quoted cells, a thousands separator, an empty cell, a "(Not Issued)" column
// that must not count as a stall reason, and a program line before the first kernel.
const char* kTwoKernels =
    "==PROF== Connected to process 1\n"
    "\"Kernel Name\",\"void a_kernel(int)\",\n"
    "\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Warp Stall Sampling (Not-issued Samples)\","
    "\"Instructions Executed\",\"stall_barrier\",\"stall_long_sb\",\"stall_barrier (Not Issued)\"\n"
    "\"0x10\",\"      LDG.E R2, [R4.64]\",\"3\",\"3\",\"1,024\",\"0\",\"\",\"0\"\n"
    "\"0x20\",\"      FADD R2, R2, 1\",\"1,500\",\"1,400\",\"1,024\",\"0\",\"1,500\",\"0\"\n"
    "\"0x30\",\"      BAR.SYNC.DEFER_BLOCKING 0x0\",\"2\",\"2\",\"1,024\",\"2\",\"0\",\"2\"\n"
    "\"0x40\",\"      STS [R3], R2\",\"700\",\"600\",\"1,024\",\"690\",\"10\",\"690\"\n"
    "\"0x50\",\"      EXIT\",\"1\",\"1\",\"1,024\",\"0\",\"0\",\"0\"\n"
    "\"0x60\",\"      BRA 0x60\",\"0\",\"0\",\"0\",\"0\",\"0\",\"0\"\n"
    "\"Kernel Name\",\"void b_kernel()\",\n"
    "\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Instructions Executed\"\n"
    "\"0x10\",\"      @!P0 EXIT\",\"5\",\"32\"\n";

}  // namespace

TEST(SassProfile, ParsesKernelsColumnsAndNumbers) {
  const auto kernels = bench::parse_ncu_source_csv(kTwoKernels);
  ASSERT_EQ(kernels.size(), 2u);
  const bench::SassKernel& a = kernels[0];
  EXPECT_EQ(a.name, "void a_kernel(int)");
  ASSERT_EQ(a.instructions.size(), 6u);
  EXPECT_EQ(a.instructions[1].address, "0x20");
  EXPECT_EQ(a.instructions[1].source, "FADD R2, R2, 1");
  EXPECT_EQ(a.instructions[1].samples, 1500);
  EXPECT_EQ(a.instructions[1].not_issued, 1400);
  EXPECT_EQ(a.instructions[1].executed, 1024);
  EXPECT_EQ(a.instructions[1].stalls.at("long_sb"), 1500);
  EXPECT_EQ(a.instructions[0].stalls.count("long_sb"), 0u);  // empty cell: nothing sampled
  EXPECT_EQ(a.instructions[3].stalls.count("barrier (Not Issued)"), 0u);
  EXPECT_EQ(a.instructions[3].stalls.at("barrier"), 690);
  EXPECT_EQ(a.samples(), 3 + 1500 + 2 + 700 + 1);
  EXPECT_EQ(a.stalls().at("barrier"), 692);
  EXPECT_EQ(kernels[1].instructions.size(), 1u);  // a header without the optional columns
  EXPECT_EQ(kernels[1].instructions[0].samples, 5);
}

TEST(SassProfile, RegionsEndAtSynchronisationPointsAndSkipDeadCode) {
  EXPECT_TRUE(bench::is_sync_instruction("BAR.SYNC.DEFER_BLOCKING 0x2, 0x100"));
  EXPECT_TRUE(bench::is_sync_instruction("@!P0  SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R2+URZ+0x37420], RZ"));
  EXPECT_TRUE(bench::is_sync_instruction("SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R11+URZ+0x37400], R6"));
  EXPECT_TRUE(bench::is_sync_instruction("WARPGROUP.DEPBAR.LE gsb0, 0x0"));
  EXPECT_TRUE(bench::is_sync_instruction("DEPBAR.LE SB0, 0x0"));
  EXPECT_TRUE(bench::is_sync_instruction("@P0   EXIT"));
  EXPECT_FALSE(bench::is_sync_instruction("HGMMA.64x32x16.F32.BF16 R152, gdesc[UR24], R152"));
  EXPECT_FALSE(bench::is_sync_instruction("WARPSYNC.ALL"));
  EXPECT_FALSE(bench::is_sync_instruction("@!P1 BRA 0x7f63ef7cb780"));

  const auto kernels = bench::parse_ncu_source_csv(kTwoKernels);
  const auto regions = bench::sass_regions(kernels[0]);
  // [LDG, FADD, BAR] [STS, EXIT]; the unreached BRA after EXIT forms no region.
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0].first, 0u);
  EXPECT_EQ(regions[0].last, 2u);
  EXPECT_EQ(regions[0].samples, 1505);
  EXPECT_EQ(regions[0].executed, 3 * 1024);
  ASSERT_FALSE(regions[0].top_stalls.empty());
  EXPECT_EQ(regions[0].top_stalls[0].first, "long_sb");
  EXPECT_EQ(regions[1].first, 3u);
  EXPECT_EQ(regions[1].last, 4u);
  EXPECT_EQ(regions[1].top_stalls[0].first, "barrier");
  const auto hot = bench::hot_instructions(kernels[0], 10);
  ASSERT_EQ(hot.size(), 5u);  // the unsampled BRA is not listed
  EXPECT_EQ(hot[0], 1u);
  EXPECT_EQ(hot[1], 3u);
}

TEST(SassProfile, RecordedMlaCaptureShowsTheWaitForP) {
  const auto kernels = load_capture();
  ASSERT_EQ(kernels.size(), 1u);
  const bench::SassKernel& k = kernels[0];
  EXPECT_NE(k.name.find("mla_decode_wgmma_kernel"), std::string::npos);
  EXPECT_EQ(k.instructions.size(), 412u);
  EXPECT_EQ(k.samples(), 62176);
  // The hottest instruction is warpgroup 1's first shared-memory read after the P-ready barrier (the sync before it), its samples barrier
  // stalls; the next two are the waits for the wgmmas (warpgroup 0's S, then warpgroup 1's P V).
  const auto hot = bench::hot_instructions(k, 3);
  ASSERT_EQ(hot.size(), 3u);
  const bench::SassInstruction& top = k.instructions[hot[0]];
  EXPECT_EQ(top.source, "LDS R8, [R4+0x37200]");
  EXPECT_EQ(top.samples, 18971);
  EXPECT_GT(top.stalls.at("barrier"), top.samples * 9 / 10);
  size_t sync = hot[0];
  while (sync > 0 && !bench::is_sync_instruction(k.instructions[sync - 1].source)) --sync;
  ASSERT_GT(sync, 0u);
  EXPECT_EQ(k.instructions[sync - 1].source.rfind("BAR.SYNC", 0), 0u) << k.instructions[sync - 1].source;
  EXPECT_EQ(k.instructions[hot[1]].source, "WARPGROUP.DEPBAR.LE gsb0, 0x0");
  EXPECT_EQ(k.instructions[hot[2]].source, "WARPGROUP.DEPBAR.LE gsb0, 0x0");
  // Every region ends at a synchronisation point or the last instruction, and they tile the executed code.
  const auto regions = bench::sass_regions(k);
  int64_t samples = 0;
  for (size_t r = 0; r < regions.size(); ++r) {
    const size_t last = regions[r].last;
    const bool after_try_wait = last > 0 && k.instructions[last - 1].source.find("TRYWAIT") != std::string::npos &&
                                k.instructions[last].source.find("BRA") != std::string::npos;
    EXPECT_TRUE(bench::is_sync_instruction(k.instructions[last].source) || after_try_wait ||
                last + 1 == k.instructions.size())
        << k.instructions[last].source;
    if (r > 0) {
      EXPECT_GT(regions[r].first, regions[r - 1].last);
    }
    samples += regions[r].samples;
  }
  EXPECT_EQ(samples, k.samples());
  // The mbarrier waits (try-wait, branch back) end their regions at the branch, which holds the waiting samples.
  const bool wait_region = std::any_of(regions.begin(), regions.end(), [&](const bench::SassRegion& r) {
    return r.last > 0 && k.instructions[r.last - 1].source.find("TRYWAIT") != std::string::npos &&
           k.instructions[r.last].source.find("BRA") != std::string::npos && r.top_stalls[0].first == "long_sb";
  });
  EXPECT_TRUE(wait_region);
  const std::string report = bench::sass_report(kernels, 5);
  EXPECT_NE(report.find("LDS R8, [R4+0x37200]: 30.5%; barrier"), std::string::npos) << report;
}

TEST(SassProfile, BadPagesNameWhatIsMissing) {
  try {
    bench::parse_ncu_source_csv("\"ID\",\"Kernel Name\"\n\"0\",\"k\"\n");
    FAIL() << "a raw page is not a source page";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no 'Kernel Name' line"), std::string::npos) << e.what();
  }
  try {
    bench::parse_ncu_source_csv(
        "\"Kernel Name\",\"k\",\n\"Address\",\"Source\",\"Instructions Executed\"\n\"0x0\",\"EXIT\",\"1\"\n");
    FAIL() << "a page without warp samples";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'Warp Stall Sampling (All Samples)'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--set full"), std::string::npos) << e.what();
  }
  try {
    bench::parse_ncu_source_csv(
        "\"Kernel Name\",\"k\",\n\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Instructions "
        "Executed\"\n");
    FAIL() << "a kernel without rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no instruction rows"), std::string::npos) << e.what();
  }
}

TEST(SassProfile, CliPrintsTheReportAndWritesJson) {
  namespace fs = std::filesystem;
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const fs::path dir = kbn::test::temp_dir("kbn_sass");
  const std::string json = (dir / "sass.json").string();
  const auto r = kbn::test::shell(exe + " profile --sass-csv '" + fixture(kCapture) + "' --top 4 --json '" + json + "'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("hot instructions"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("regions between synchronisation points"), std::string::npos) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["kernels"].size(), 1u);
  EXPECT_EQ(j["kernels"][0]["hot_instructions"].size(), 4u);
  EXPECT_EQ(j["kernels"][0]["hot_instructions"][0]["source"], "LDS R8, [R4+0x37200]");
  EXPECT_EQ(j["kernels"][0]["regions"].size(), 4u);
  EXPECT_EQ(j["kernels"][0]["samples"], 62176);

  const auto bad = kbn::test::shell(exe + " profile --sass-csv '" + fixture(kCapture) + "' --target rms_norm");
  EXPECT_NE(bad.code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--sass-csv analyses a source-page capture on its own"), std::string::npos) << bad.output;
  const auto missing = kbn::test::shell(exe + " profile --sass-csv '" + (dir / "none.csv").string() + "'");
  EXPECT_NE(missing.code, 0) << missing.output;
  EXPECT_NE(missing.output.find("--sass-csv: cannot read"), std::string::npos) << missing.output;
  fs::remove_all(dir);
}
