// kb_nano profile without a GPU: the ncu CSV parser, the classification and advice, the ncu command line and
// failure diagnoses, run_ncu against a stand-in ncu script, and the CLI on the synthetic captures in
// tests/fixtures/ncu/ (hand-written in ncu's format; see the README there).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "bench/profile.h"
#include "kbn/error.h"
#include "test_paths.h"
#include "test_process.h"

using namespace kbn;
using bench::Bound;

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return kbn::test::fixture_dir() + "/ncu/" + name; }

std::string read(const std::string& path) { return kbn::test::read_file(path); }

std::vector<bench::KernelProfile> load(const std::string& name) {
  return bench::group_launches(bench::parse_ncu_csv(read(fixture(name))));
}

bool mentions(const bench::KernelAnalysis& a, const std::string& text) {
  return std::any_of(a.advice.begin(), a.advice.end(),
                     [&](const bench::Advice& x) { return x.text.find(text) != std::string::npos; });
}

// A launch built from metric values in base units, for regimes the fixtures do not cover.
bench::KernelLaunch launch(const std::map<std::string, double>& values, const std::string& cc = "9.0") {
  bench::KernelLaunch k;
  k.name = "void k<float>(int)";
  k.cc = cc;
  for (const auto& [name, v] : values) k.metrics[name] = {v, "", ""};
  return k;
}

void write_executable(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), 0755);
}

}  // namespace

// ---- parsing ----

TEST(ProfileCsv, ScaledUnitsSeparatorsNaAndInterleavedOutput) {
  const auto launches = bench::parse_ncu_csv(read(fixture("synthetic_rms_norm_baseline.csv")));
  ASSERT_EQ(launches.size(), 4u);  // the program's own lines between rows are skipped
  const auto& k = launches[0];
  EXPECT_EQ(k.id, "0");
  EXPECT_EQ(k.name,
            "void kbn::baseline::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, false, true, 256>"
            "(kbn::baseline::(anonymous namespace)::RmsNormParams)");
  EXPECT_EQ(k.block_size, "(256, 1, 1)");
  EXPECT_EQ(k.grid_size, "(4096, 1, 1)");
  EXPECT_EQ(k.device, "NVIDIA H200");
  EXPECT_EQ(k.cc, "9.0");
  EXPECT_NEAR(*k.get("gpu__time_duration.sum"), 22460, 1e-6);  // 22.46 usecond
  EXPECT_EQ(k.metrics.at("gpu__time_duration.sum").unit, "nsecond");
  EXPECT_NEAR(*k.get("dram__bytes_read.sum"), 34.71e6, 1e-3);  // 34.71 Mbyte
  EXPECT_EQ(k.metrics.at("dram__bytes_read.sum").unit, "byte");
  EXPECT_EQ(*k.get("launch__grid_size"), 4096);  // printed "4,096"
  EXPECT_EQ(*k.get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"), 36864);
  EXPECT_FALSE(k.get("launch__occupancy_limit_barriers").has_value());
  EXPECT_EQ(k.metrics.at("launch__occupancy_limit_barriers").text, "n/a");
  EXPECT_FALSE(k.get("no__such_metric").has_value());
}

TEST(ProfileCsv, BaseUnits) {
  const auto launches = bench::parse_ncu_csv(read(fixture("synthetic_rms_norm_candidate.csv")));
  ASSERT_EQ(launches.size(), 4u);
  EXPECT_EQ(*launches[0].get("gpu__time_duration.sum"), 15930);
  EXPECT_EQ(*launches[0].get("dram__bytes_read.sum"), 33562624);
  EXPECT_EQ(launches[0].metrics.at("launch__shared_mem_per_block_static").unit, "byte/block");
}

TEST(ProfileCsv, FixturesCarryExactlyTheRequestedMetrics) {
  const std::set<std::string> requested(bench::profile_metrics().begin(), bench::profile_metrics().end());
  EXPECT_EQ(requested.size(), bench::profile_metrics().size()) << "a metric is requested twice";
  for (const char* f : {"synthetic_rms_norm_baseline.csv", "synthetic_rms_norm_candidate.csv",
                        "synthetic_flash_attn_prefill_baseline.csv", "synthetic_flash_attn_decode_baseline.csv"}) {
    std::set<std::string> present;
    const auto launches = bench::parse_ncu_csv(read(fixture(f)));
    for (const auto& [name, m] : launches.at(0).metrics) present.insert(name);
    EXPECT_EQ(present, requested) << f;
  }
}

TEST(ProfileCsv, QuotingWithoutUnitsRowAndRaggedLines) {
  const std::string csv =
      "garbage before the header\n"
      "\"ID\",\"Kernel Name\",\"Block Size\",\"Grid Size\",\"gpu__time_duration.sum\",\"x__y.sum\"\n"
      "\"0\",\"void f<\"\"q\"\", 2>(int, float)\",\"(32, 1, 1)\",\"(1, 1, 1)\",\"1,234.5\",\"n/a\"\n"
      "\"1\",\"short row\"\n"
      "\"2\",\"g\",\"(64, 1, 1)\",\"(2, 1, 1)\",\"7\",\"\"\n";
  const auto launches = bench::parse_ncu_csv(csv);
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].name, "void f<\"q\", 2>(int, float)");
  EXPECT_EQ(*launches[0].get("gpu__time_duration.sum"), 1234.5);
  EXPECT_EQ(launches[0].metrics.at("gpu__time_duration.sum").unit, "");
  EXPECT_FALSE(launches[0].get("x__y.sum"));
  EXPECT_EQ(launches[1].id, "2");
  EXPECT_FALSE(launches[1].get("x__y.sum"));
}

TEST(ProfileCsv, NoHeaderIsAnError) {
  try {
    bench::parse_ncu_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--csv --page raw"), std::string::npos) << e.what();
  }
}

TEST(ProfileCsv, NormaliseUnit) {
  struct Case {
    double in;
    std::string unit;
    double out;
    std::string base;
  };
  for (const Case& c : std::vector<Case>{{1.5, "usecond", 1500, "nsecond"},
                                         {2, "msecond", 2e6, "nsecond"},
                                         {3, "second", 3e9, "nsecond"},
                                         {7, "nsecond", 7, "nsecond"},
                                         {1.25, "Gbyte/second", 1.25e9, "byte/second"},
                                         {1, "Kbyte/block", 1000, "byte/block"},
                                         {4, "Minst", 4e6, "inst"},
                                         {62.5, "%", 62.5, "%"},
                                         {168, "register/thread", 168, "register/thread"},
                                         {5, "Mfoo", 5, "Mfoo"}}) {
    double v = c.in;
    std::string u = c.unit;
    bench::normalise_unit(v, u);
    EXPECT_DOUBLE_EQ(v, c.out) << c.unit;
    EXPECT_EQ(u, c.base) << c.unit;
  }
}

TEST(ProfileCsv, ShortKernelName) {
  EXPECT_EQ(bench::short_kernel_name("void kbn::baseline::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, "
                                     "false, true, 256>(kbn::baseline::(anonymous namespace)::RmsNormParams)"),
            "rms_norm_kernel<__nv_bfloat16, false, true, 256>");
  EXPECT_EQ(bench::short_kernel_name("void f<(anonymous namespace)::X>(int)"), "f<(anonymous namespace)::X>");
  // How ncu 2025.3 on the H200 wrote the anonymous namespace (recorded_rms_norm_*.csv).
  EXPECT_EQ(bench::short_kernel_name("void unnamed>::rms_norm_kernel<__nv_bfloat16, 0, 1, 256>(unnamed>::RmsNormParams)"),
            "rms_norm_kernel<__nv_bfloat16, 0, 1, 256>");
  EXPECT_EQ(bench::short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64");
  EXPECT_EQ(bench::short_kernel_name("ns::k(int)"), "k");
}

TEST(ProfileCsv, GroupLaunchesKeepsOrderAndPicksTheMedianLaunch) {
  const auto rms = load("synthetic_rms_norm_baseline.csv");
  ASSERT_EQ(rms.size(), 1u);
  EXPECT_EQ(rms[0].launches, 4);
  EXPECT_EQ(rms[0].short_name, "rms_norm_kernel<__nv_bfloat16, false, true, 256>");
  EXPECT_NEAR(*rms[0].representative.get("gpu__time_duration.sum"), 22530, 1e-6);  // of 22.46 22.53 22.61 22.71
  const auto decode = load("synthetic_flash_attn_decode_baseline.csv");
  ASSERT_EQ(decode.size(), 2u);
  EXPECT_EQ(decode[0].short_name, "flash_attn_decode_split_kernel<__nv_bfloat16, 128>");
  EXPECT_EQ(decode[1].short_name, "flash_attn_decode_reduce_kernel<__nv_bfloat16>");
  EXPECT_EQ(decode[0].launches, 2);
  EXPECT_EQ(decode[1].launches, 2);
}

// ---- analysis ----

TEST(ProfileAnalysis, MemoryBoundWithHeadroom) {
  bench::AnalysisOptions o;
  o.ideal_bytes = 67117056;  // rms_norm T=4096 H=4096: traffic is within 2% of it, so no traffic advice
  const auto a = bench::analyze_kernel(load("synthetic_rms_norm_baseline.csv")[0].representative, o);
  EXPECT_EQ(a.bound, Bound::memory);
  EXPECT_NEAR(*a.dram_pct, 62.31, 1e-9);
  EXPECT_NEAR(*a.duration_us, 22.53, 1e-9);
  EXPECT_EQ(a.occupancy_limiter, "registers");  // registers and warps both allow 8 blocks: the first listed wins
  EXPECT_EQ(*a.limiter_blocks, 8);
  ASSERT_EQ(a.top_stalls.size(), 3u);
  EXPECT_EQ(a.top_stalls[0].reason, "long_scoreboard");
  EXPECT_EQ(a.top_stalls[1].reason, "barrier");
  EXPECT_EQ(a.top_stalls[2].reason, "wait");
  EXPECT_NEAR(a.top_stalls[0].share_pct, 100.0 * 24.6 / (24.6 + 4.1 + 2.9 + 1.6 + 0.7 + 0.5), 1e-9);
  ASSERT_FALSE(a.advice.empty());
  EXPECT_NE(a.advice[0].text.find("Memory-bound at 62% of peak DRAM bandwidth, 38% left"), std::string::npos)
      << a.advice[0].text;
  EXPECT_FALSE(mentions(a, "the ideal"));
  EXPECT_FALSE(mentions(a, "tensor"));
}

TEST(ProfileAnalysis, NearTheRoofline) {
  const auto a = bench::analyze_kernel(load("synthetic_rms_norm_candidate.csv")[0].representative, {});
  EXPECT_EQ(a.bound, Bound::memory);
  ASSERT_EQ(a.advice.size(), 1u);
  EXPECT_NE(a.advice[0].text.find("88% of peak DRAM bandwidth, near the roofline"), std::string::npos);
}

TEST(ProfileAnalysis, ComputeBoundOnHmmaWithoutGmma) {
  const auto k = load("synthetic_flash_attn_prefill_baseline.csv")[0].representative;
  bench::AnalysisOptions o;
  o.matrix_op = true;
  const auto a = bench::analyze_kernel(k, o);
  EXPECT_EQ(a.bound, Bound::compute);
  EXPECT_EQ(*a.hmma_instructions, 268435456);
  EXPECT_EQ(*a.gmma_instructions, 0);
  EXPECT_EQ(a.occupancy_limiter, "registers");
  EXPECT_EQ(*a.limiter_blocks, 1);
  EXPECT_EQ(a.top_stalls[0].reason, "math_pipe_throttle");
  ASSERT_GE(a.advice.size(), 3u);
  EXPECT_NE(a.advice[0].text.find("HMMA (mma.sync, 268.44M instructions) but no GMMA"), std::string::npos)
      << a.advice[0].text;
  EXPECT_NE(a.advice[1].text.find("Compute-bound at 71%"), std::string::npos) << a.advice[1].text;
  EXPECT_NE(a.advice[2].text.find("Theoretical occupancy 12.5% (achieved 12.1%), limited by registers: 168 "
                                  "registers/thread allow 1 block(s) per SM"),
            std::string::npos)
      << a.advice[2].text;
  EXPECT_FALSE(mentions(a, "bank conflicts"));  // 1% of shared wavefronts is below the 10% bar

  // Not a matrix op: no tensor-core advice, the compute line leads.
  const auto plain = bench::analyze_kernel(k, {});
  EXPECT_FALSE(mentions(plain, "GMMA"));
  EXPECT_NE(plain.advice[0].text.find("Compute-bound"), std::string::npos);
}

TEST(ProfileAnalysis, LatencyBoundWithSpillsConflictsAndLowOccupancy) {
  bench::AnalysisOptions o;
  o.matrix_op = true;
  const auto a = bench::analyze_kernel(load("synthetic_flash_attn_decode_baseline.csv")[0].representative, o);
  EXPECT_EQ(a.bound, Bound::latency);
  EXPECT_EQ(a.top_stalls[0].reason, "long_scoreboard");
  EXPECT_EQ(a.top_stalls[1].reason, "short_scoreboard");
  EXPECT_EQ(a.top_stalls[2].reason, "barrier");
  EXPECT_EQ(a.occupancy_limiter, "registers");  // registers and shared memory both allow 2 blocks
  // Ranked: spills (a concrete cause of the long-scoreboard stalls), the latency diagnosis, occupancy,
  // tensor-core path, bank conflicts.
  ASSERT_EQ(a.advice.size(), 5u);
  EXPECT_NE(a.advice[0].text.find("Local memory traffic 4.2 MB loaded, 2.1 MB stored, 98.3K spill instructions "
                                  "at 255 registers/thread"),
            std::string::npos)
      << a.advice[0].text;
  EXPECT_NE(a.advice[1].text.find("Latency-bound: SM at 22% and memory at 33% of peak"), std::string::npos);
  EXPECT_NE(a.advice[1].text.find("(long_scoreboard, 62% of stall cycles)"), std::string::npos) << a.advice[1].text;
  EXPECT_NE(a.advice[2].text.find("limited by registers"), std::string::npos);
  EXPECT_NE(a.advice[3].text.find("HMMA"), std::string::npos);
  EXPECT_NE(a.advice[4].text.find("bank conflicts, loads 2.36M of 6.29M wavefronts (38%), stores 65.5K of "
                                  "1.05M (6.2%)"),
            std::string::npos)
      << a.advice[4].text;
  for (size_t i = 1; i < a.advice.size(); ++i) EXPECT_GE(a.advice[i - 1].score, a.advice[i].score);
}

TEST(ProfileAnalysis, LaunchBound) {
  const auto a = bench::analyze_kernel(load("synthetic_flash_attn_decode_baseline.csv")[1].representative, {});
  EXPECT_EQ(a.bound, Bound::launch);
  ASSERT_FALSE(a.advice.empty());
  EXPECT_NE(a.advice[0].text.find("Launch-bound: 2.1 us, with no unit busy"), std::string::npos) << a.advice[0].text;
  EXPECT_FALSE(mentions(a, "occupancy"));

  // A tiny grid says how many SMs it leaves without work.
  const auto small = bench::analyze_kernel(launch({{"gpu__time_duration.sum", 1800},
                                                   {"dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.4},
                                                   {"sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.9},
                                                   {"launch__grid_size", 8}}),
                                           {});
  EXPECT_EQ(small.bound, Bound::launch);
  EXPECT_NE(small.advice[0].text.find("on 8 blocks (8 of 132 SMs have work)"), std::string::npos)
      << small.advice[0].text;
}

TEST(ProfileAnalysis, ComputeBoundMatrixKernelWithoutTensorCores) {
  const auto k = launch({{"gpu__time_duration.sum", 900e3},
                         {"dram__throughput.avg.pct_of_peak_sustained_elapsed", 8},
                         {"sm__throughput.avg.pct_of_peak_sustained_elapsed", 86},
                         {"sm__inst_executed_pipe_tensor_op_hmma.sum", 0},
                         {"sm__inst_executed_pipe_tensor_op_gmma.sum", 0}});
  bench::AnalysisOptions o;
  o.matrix_op = true;
  const auto a = bench::analyze_kernel(k, o);
  EXPECT_EQ(a.bound, Bound::compute);
  ASSERT_EQ(a.advice.size(), 1u);
  EXPECT_NE(a.advice[0].text.find("No tensor-core instructions (HMMA = GMMA = 0) in a matrix kernel"),
            std::string::npos);
  EXPECT_EQ(a.advice[0].score, 90);
}

TEST(ProfileAnalysis, BoundThresholds) {
  auto bound = [](double us, double dram, double sm, double mem) {
    return bench::analyze_kernel(launch({{"gpu__time_duration.sum", us * 1e3},
                                         {"dram__throughput.avg.pct_of_peak_sustained_elapsed", dram},
                                         {"sm__throughput.avg.pct_of_peak_sustained_elapsed", sm},
                                         {"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", mem}}),
                                 {})
        .bound;
  };
  EXPECT_EQ(bound(100, 70, 30, 70), Bound::memory);
  EXPECT_EQ(bound(100, 20, 30, 75), Bound::memory);  // L1/L2/shared, not DRAM
  EXPECT_EQ(bound(100, 20, 75, 30), Bound::compute);
  EXPECT_EQ(bound(100, 65, 70, 65), Bound::compute);
  EXPECT_EQ(bound(100, 30, 40, 45), Bound::latency);
  EXPECT_EQ(bound(3, 30, 40, 45), Bound::launch);
  EXPECT_EQ(bound(3, 85, 20, 85), Bound::memory);  // short, but saturating DRAM
  EXPECT_EQ(bench::analyze_kernel(launch({{"gpu__time_duration.sum", 5000}}), {}).bound, Bound::unknown);
}

TEST(ProfileAnalysis, OccupancyLimiterIsTheSmallestLimit) {
  const auto a = bench::analyze_kernel(launch({{"launch__occupancy_limit_registers", 4},
                                               {"launch__occupancy_limit_shared_mem", 2},
                                               {"launch__occupancy_limit_warps", 8},
                                               {"launch__occupancy_limit_blocks", 32}}),
                                       {});
  EXPECT_EQ(a.occupancy_limiter, "shared memory");
  EXPECT_EQ(*a.limiter_blocks, 2);
  const auto b = bench::analyze_kernel(
      launch({{"launch__occupancy_limit_blocks", 16}, {"launch__occupancy_limit_warps", 16}}), {});
  EXPECT_EQ(b.occupancy_limiter, "block size (warps per SM)");
}

TEST(ProfileAnalysis, TrafficAboveTheIdealBytes) {
  bench::AnalysisOptions o;
  o.ideal_bytes = 100'000'000;
  const auto a = bench::analyze_kernel(launch({{"gpu__time_duration.sum", 80e3},
                                               {"dram__throughput.avg.pct_of_peak_sustained_elapsed", 70},
                                               {"sm__throughput.avg.pct_of_peak_sustained_elapsed", 20},
                                               {"dram__bytes_read.sum", 180e6},
                                               {"dram__bytes_write.sum", 20e6},
                                               {"lts__t_sector_hit_rate.pct", 12}}),
                                       o);
  ASSERT_FALSE(a.advice.empty());
  EXPECT_NE(a.advice[0].text.find("DRAM traffic 200.0 MB is 2.00x the ideal 100.0 MB"), std::string::npos)
      << a.advice[0].text;
  EXPECT_NE(a.advice[0].text.find("(L2 hit rate 12.0%)"), std::string::npos);
}

// Real captures from the H200 (tests/fixtures/ncu/recorded_*.csv, written by --save-csv): only what holds for
// any capture of that op is checked, so a re-recording on another driver or ncu version still passes.
TEST(ProfileRecorded, EveryRecordedCaptureParsesAndClassifies) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kbn::test::fixture_dir() + "/ncu"))
    if (e.path().filename().string().rfind("recorded_", 0) == 0 && e.path().extension() == ".csv")
      files.push_back(e.path());
  if (files.empty()) GTEST_SKIP() << "no recorded captures in tests/fixtures/ncu yet";
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    const auto kernels = bench::group_launches(bench::parse_ncu_csv(read(f.string())));
    ASSERT_FALSE(kernels.empty()) << name;
    for (const auto& k : kernels) {
      const auto a = bench::analyze_kernel(k.representative, {});
      EXPECT_GT(a.duration_us.value_or(0), 0) << name << " " << k.short_name;
      EXPECT_NE(a.bound, Bound::unknown) << name << " " << k.short_name;
      EXPECT_FALSE(a.occupancy_limiter.empty()) << name << " " << k.short_name;
      const double tensor = a.hmma_instructions.value_or(0) + a.gmma_instructions.value_or(0);
      if (name.find("rms_norm") != std::string::npos) {
        // No matrix work: the H200 capture counts one tensor-pipe instruction per block (4096, 0.05% of
        // cycles), so the signal is the pipe's activity, not a zero count.
        EXPECT_LT(a.tensor_pipe_pct.value_or(0), 1.0) << name;
        EXPECT_LE(tensor, a.grid_size.value_or(0)) << name;
      }
      if (name.find("flash_attn_prefill") != std::string::npos) {
        EXPECT_GT(tensor, 0) << name;  // mma.sync (the first capture) or wgmma (the Hopper kernel's)
      }
    }
  }
}

// The Hopper prefill kernel (wgmma) as the H200 recorded it: GMMA counted, HMMA not advised against, and the advice
// points at the idle tensor pipe; the decode capture is one kernel when the split count is one (no reduce launch).
TEST(ProfileRecorded, HopperAttentionCaptures) {
  const auto prefill = load("recorded_flash_attn_prefill_wgmma_baseline_seqs1x4096.csv");
  ASSERT_EQ(prefill.size(), 1u);
  EXPECT_EQ(prefill[0].short_name, "flash_attn_prefill_wgmma_kernel<__nv_bfloat16, 128>");
  bench::AnalysisOptions o;
  o.matrix_op = true;
  const auto a = bench::analyze_kernel(prefill[0].representative, o);
  EXPECT_GT(a.gmma_instructions.value_or(0), 0);
  EXPECT_TRUE(mentions(a, "GMMA in use but the tensor pipe is active"));
  EXPECT_FALSE(mentions(a, "but no GMMA"));

  const auto decode = load("recorded_flash_attn_decode_baseline_B64x4096.csv");
  ASSERT_EQ(decode.size(), 1u);
  const auto d = bench::analyze_kernel(decode[0].representative, o);
  EXPECT_EQ(d.bound, Bound::memory);
  EXPECT_GT(d.hmma_instructions.value_or(0), 0);  // mma.sync on a memory-bound kernel: no wgmma advice
  EXPECT_FALSE(mentions(d, "GMMA"));
  EXPECT_TRUE(mentions(d, "near the roofline"));
}

// ---- runner ----

TEST(ProfileRunner, NcuCommandLine) {
  bench::NcuInvocation inv;
  inv.ncu = "/usr/local/cuda/bin/ncu";
  inv.workload = {"/build/kb_nano", "kernels", "--case", "T=4096 H=4096"};
  inv.kernel_regex = "kbn::baseline::";
  inv.launch_skip = 8;
  inv.launch_count = 4;
  inv.metrics = {"gpu__time_duration.sum", "dram__bytes_read.sum"};
  inv.log_file = "/tmp/x.csv";
  const auto argv = bench::ncu_argv(inv);
  auto after = [&](const std::string& flag) {
    auto it = std::find(argv.begin(), argv.end(), flag);
    return it == argv.end() || it + 1 == argv.end() ? std::string("<missing>") : *(it + 1);
  };
  EXPECT_EQ(argv.front(), inv.ncu);
  EXPECT_EQ(after("--clock-control"), "none");
  EXPECT_EQ(after("--target-processes"), "all");
  EXPECT_EQ(after("--cache-control"), "all");
  EXPECT_EQ(after("--page"), "raw");
  EXPECT_EQ(after("--kernel-name-base"), "demangled");
  EXPECT_EQ(after("--kernel-name"), "regex:kbn::baseline::");
  EXPECT_EQ(after("--launch-skip"), "8");
  EXPECT_EQ(after("--launch-count"), "4");
  EXPECT_EQ(after("--metrics"), "gpu__time_duration.sum,dram__bytes_read.sum");
  EXPECT_EQ(after("--log-file"), "/tmp/x.csv");
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--csv"), argv.end());
  EXPECT_TRUE(std::equal(inv.workload.rbegin(), inv.workload.rend(), argv.rbegin()));
  EXPECT_EQ(bench::shell_join({"a b", "it's"}), "'a b' 'it'\\''s'");
}

TEST(ProfileRunner, LocateNcu) {
  try {
    bench::locate_ncu("/nonexistent/ncu", "");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ncu: '/nonexistent/ncu' is not an executable file"), std::string::npos);
  }
  const fs::path dir = kbn::test::temp_dir("kbn_profile_test");
  write_executable(dir / "ncu", "#!/bin/sh\n");
  EXPECT_EQ(bench::locate_ncu("", "/nonexistent-dir:" + dir.string()), (dir / "ncu").string());
  EXPECT_EQ(bench::locate_ncu((dir / "ncu").string(), ""), (dir / "ncu").string());
  fs::remove_all(dir);
}

TEST(ProfileRunner, NcuNotFoundNamesWhereItLooked) {
  if (fs::exists("/usr/local/cuda/bin/ncu") || fs::exists("/opt/nvidia/nsight-compute"))
    GTEST_SKIP() << "this machine has ncu in a default install folder";
  try {
    bench::locate_ncu("", "/kbn-no-such-dir:/kbn-other-dir");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ncu was not found"), std::string::npos) << m;
    EXPECT_NE(m.find("/kbn-no-such-dir:/kbn-other-dir:/usr/local/cuda/bin"), std::string::npos) << m;
    EXPECT_NE(m.find("--ncu /path/to/ncu"), std::string::npos) << m;
  }
}

TEST(ProfileRunner, Diagnoses) {
  const std::string perm =
      "==PROF== Connected to process 7\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
      "NVIDIA GPU Performance Counters on the target device 0.\n";
  EXPECT_NE(bench::diagnose_ncu_output(perm, "x").find("NVreg_RestrictProfilingToAdminUsers=0"), std::string::npos);
  const std::string none =
      "==PROF== Disconnected from process 9\n==WARNING== No kernels were profiled.\nAvailable Kernels:\n"
      "1. fill_random_kernel\n2. convert_kernel\n";
  const std::string d = bench::diagnose_ncu_output(none, "kbn::baseline::");
  EXPECT_NE(d.find("none matched --kernel-name regex:kbn::baseline::"), std::string::npos) << d;
  EXPECT_NE(d.find("1. fill_random_kernel"), std::string::npos) << d;
  EXPECT_EQ(bench::diagnose_ncu_output("==PROF== Disconnected from process 9\n", "x"), "");
}

TEST(ProfileRunner, UnknownMetricsMatchWholeNames) {
  const std::vector<std::string> requested = {"sass__inst_executed_register_spilling", "dram__bytes_read.sum",
                                              "sm__inst_executed_pipe_tensor_op_gmma.sum"};
  const std::string out =
      "==ERROR== Failed to find metric regex:^sass__inst_executed_register_spilling(\\.(sum|avg))?$\n"
      "==ERROR== Failed to find metric regex:^dram__bytes_read_extra\\.sum$\n"
      "dram__bytes_read.sum is fine\n";
  EXPECT_EQ(bench::unknown_metrics(out, requested), std::vector<std::string>{"sass__inst_executed_register_spilling"});
}

// run_ncu against a stand-in ncu: the first call rejects a metric (as an ncu that lacks it does), the second
// writes a capture to --log-file while the "program" prints its own output.
TEST(ProfileRunner, RunNcuRetriesWithoutAnUnknownMetric) {
  const fs::path dir = kbn::test::temp_dir("kbn_profile_test");
  write_executable(dir / "ncu",
                   "#!/bin/bash\n"
                   "log=''; metrics=''\n"
                   "while [ $# -gt 0 ]; do case \"$1\" in --log-file) log=\"$2\"; shift;; --metrics) metrics=\"$2\"; "
                   "shift;; esac; shift; done\n"
                   "case \"$metrics\" in *sass__inst_executed_register_spilling*)\n"
                   "  echo '==ERROR== Failed to find metric regex:^sass__inst_executed_register_spilling$' > \"$log\"; "
                   "exit 1;; esac\n"
                   "echo 'program output'\n"
                   "cp '" +
                       fixture("synthetic_rms_norm_candidate.csv") + "' \"$log\"\n");
  bench::NcuInvocation inv;
  inv.ncu = (dir / "ncu").string();
  inv.workload = {"/bin/true"};
  inv.kernel_regex = "kbn::candidate::";
  inv.metrics = bench::profile_metrics();
  const bench::NcuResult r = bench::run_ncu(inv);
  EXPECT_EQ(r.dropped_metrics, std::vector<std::string>{"sass__inst_executed_register_spilling"});
  EXPECT_EQ(r.launches.size(), 4u);
  EXPECT_EQ(r.command.find("sass__inst_executed_register_spilling"), std::string::npos);

  write_executable(dir / "ncu",
                   "#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
                   "GPU Performance Counters on the target device 0.'\nexit 1\n");
  try {
    bench::run_ncu(inv);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NVreg_RestrictProfilingToAdminUsers=0"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---- the CLI ----

TEST(ProfileCli, FromCsvBaselineAndCandidateSideBySide) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const fs::path dir = kbn::test::temp_dir("kbn_profile_test");
  const kbn::test::ShellResult r = kbn::test::shell(
      exe + " profile --target rms_norm --case 'T=4096 H=4096' --from-csv " +
      fixture("synthetic_rms_norm_baseline.csv") + " --candidate-csv " + fixture("synthetic_rms_norm_candidate.csv") +
      " --json " + (dir / "p.json").string() + " --markdown " + (dir / "p.md").string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string& out = r.output;
  const size_t advice = out.find("Advice (most impactful first)");
  const size_t table = out.find("metric ");
  ASSERT_NE(advice, std::string::npos) << out;
  ASSERT_NE(table, std::string::npos) << out;
  EXPECT_LT(advice, table) << "advice comes before the table";
  EXPECT_NE(out.find("rms_norm  llama-3.1-8b-instruct  tp=1  T=4096 H=4096"), std::string::npos) << out;
  EXPECT_NE(out.find("baseline: rms_norm_kernel<__nv_bfloat16, false, true, 256>"), std::string::npos) << out;
  EXPECT_NE(out.find("candidate: rms_norm_kernel<__nv_bfloat16, false, true, 256>"), std::string::npos) << out;
  EXPECT_NE(out.find("kernel time under ncu: baseline 22.53 us, candidate 15.90 us (-29.4%)"), std::string::npos)
      << out;

  const auto j = nlohmann::json::parse(read((dir / "p.json").string()));
  EXPECT_EQ(j["provenance"]["source"], "csv");
  const auto& c = j["cases"].at(0);
  EXPECT_EQ(c["ideal_bytes"], 67117056);
  ASSERT_EQ(c["variants"].size(), 2u);
  EXPECT_EQ(c["variants"][0]["variant"], "baseline");
  EXPECT_EQ(c["variants"][1]["variant"], "candidate");
  const auto& k = c["variants"][0]["kernels"].at(0);
  EXPECT_EQ(k["launches"], 4);
  EXPECT_NEAR(k["metrics"]["gpu__time_duration.sum"]["value"].get<double>(), 22530, 1e-6);
  EXPECT_EQ(k["metrics"]["gpu__time_duration.sum"]["unit"], "nsecond");
  EXPECT_TRUE(k["metrics"]["launch__occupancy_limit_barriers"]["value"].is_null());
  EXPECT_EQ(k["analysis"]["bound"], "memory");
  EXPECT_EQ(k["analysis"]["occupancy_limiter"], "registers");
  EXPECT_FALSE(k["analysis"]["advice"].empty());
  const std::string md = read((dir / "p.md").string());
  EXPECT_NE(md.find("| metric |"), std::string::npos) << md;
  EXPECT_LT(md.find("Memory-bound at 62%"), md.find("| metric |"));
  fs::remove_all(dir);
}

TEST(ProfileCli, MissingNcuIsAClearError) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const kbn::test::ShellResult r = kbn::test::shell(
      exe + " profile --target rms_norm --case 'T=4096 H=4096' --variant baseline --ncu /nonexistent/ncu");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--ncu: '/nonexistent/ncu' is not an executable file"), std::string::npos) << r.output;
}
