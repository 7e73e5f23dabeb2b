#pragma once
// `kb_nano profile`: Nsight Compute (ncu) counters of an op's kernels turned into a diagnosis and advice.
//
// Four parts, each usable alone:
//   1. the metrics requested from ncu (Nsight Compute metric names for sm_90; see profile.cpp for which
//      names were checked against public ncu output and which the first GPU run must confirm);
//   2. a parser for `ncu --csv --page raw` output (header row, optional units row, one row per launch);
//   3. the analysis of one kernel: what bounds it, occupancy and its limiter, top stalls, caches, bank
//      conflicts, spills, tensor-core use, and ranked advice lines with the numbers that justify them;
//   4. the runner: the ncu command line around a profiled process, and the diagnosis of ncu's failures
//      (not installed, no counter permission, a metric this ncu does not know, no kernel matched).
// Parts 2 and 3 need no GPU; the tests run them on CSV fixtures (tests/fixtures/ncu/).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kbn::bench {

// ---- 1. metrics ----

// Names passed to `ncu --metrics`, in the order they are documented in profile.cpp.
const std::vector<std::string>& profile_metrics();

// Warp-stall reasons read from smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio.
const std::vector<std::string>& stall_reasons();
std::string stall_metric(const std::string& reason);

// ---- 2. parsing ----

struct MetricValue {
  std::optional<double> value;  // in the base unit (nanoseconds, bytes, ...); empty for "n/a" or text
  std::string unit;             // the base unit after normalisation ("nsecond", "byte", "%", ...)
  std::string text;             // the cell as ncu printed it
};

// One profiled kernel launch: one data row of the raw page.
struct KernelLaunch {
  std::string id;                     // ncu's launch ID
  std::string name;                   // as printed (a demangled signature with --print-kernel-base demangled)
  std::string block_size, grid_size;  // "(256, 1, 1)"
  std::string device, cc;             // "NVIDIA H200", "9.0"
  std::map<std::string, MetricValue> metrics;

  std::optional<double> get(const std::string& metric) const;
};

// Converts a value printed with an ncu unit to its base unit: "usecond" -> nanoseconds, "Mbyte" -> bytes
// (ncu's prefixes are decimal), "Kinst" -> instructions; compound units scale their numerator
// ("Gbyte/second" -> "byte/second"). Units without a prefix pass through.
void normalise_unit(double& value, std::string& unit);

// CSV cells as ncu writes them (also read by bench/sass_profile.cpp):
// one record (RFC 4180 quoting) into `out`, false when a quote is left open;
bool split_csv(const std::string& line, std::vector<std::string>& out);
// a cell without surrounding whitespace;
std::string trim(const std::string& s);
// a number: "1,234.5" -> 1234.5; "n/a", "" and text -> nullopt.
std::optional<double> parse_number(const std::string& cell);

// Parses the output of `ncu --csv --page raw` (any --print-units). Lines before the header and lines that
// are not CSV rows of the header's width (==PROF== lines, the profiled program's own output) are skipped.
// Numbers may carry thousands separators ("1,234.5"); "n/a" and empty cells have no value. Throws
// kbn::Error when there is no header row.
std::vector<KernelLaunch> parse_ncu_csv(const std::string& text);

// The launches of one kernel (same name, grid and block) merged: the launch with the median duration
// stands for all of them, so one slow replay does not skew the report.
struct KernelProfile {
  std::string name;        // full name as printed
  std::string short_name;  // without return type, namespaces and parameters: "rms_norm_kernel<...>"
  int launches = 0;
  KernelLaunch representative;
};
std::vector<KernelProfile> group_launches(const std::vector<KernelLaunch>& launches);

// "void kbn::baseline::(anonymous namespace)::rms_norm_kernel<float, false>(Params)" ->
// "rms_norm_kernel<float, false>".
std::string short_kernel_name(const std::string& name);

// ---- 3. analysis ----

enum class Bound { memory, compute, latency, launch, unknown };
const char* bound_name(Bound b);

struct Stall {
  std::string reason;           // "long_scoreboard"
  double cycles_per_issue = 0;  // average warps stalled for this reason per issued instruction
  double share_pct = 0;         // of all stall cycles (the "selected" state excluded)
};

struct AnalysisOptions {
  bool matrix_op = false;       // the op multiplies matrices, so tensor-core use is expected
  int64_t ideal_bytes = 0;      // DRAM bytes of an ideal kernel (bench/cases.h BenchCase::bytes); 0 = unknown
  int fallback_sm_count = 132;  // when the capture lacks device__attribute_multiprocessor_count (H100/H200)
};

struct Advice {
  double score = 0;  // rough share of the kernel's time at stake, 0..100; orders the lines
  std::string text;
};

struct KernelAnalysis {
  Bound bound = Bound::unknown;
  std::string bound_detail;  // what was compared, e.g. "DRAM 86% >= SM 31%"
  std::optional<double> duration_us, dram_pct, sm_pct, memory_pct;
  std::optional<double> dram_read_bytes, dram_write_bytes;
  std::optional<double> achieved_occupancy_pct, theoretical_occupancy_pct;
  std::string occupancy_limiter;         // "registers", "shared memory", "block size (warps)", "blocks per SM", ...
  std::optional<double> limiter_blocks;  // blocks per SM the limiter allows
  std::optional<double> registers_per_thread, block_size, grid_size, shared_bytes_per_block, waves;
  int sm_count = 0;
  std::vector<Stall> top_stalls;  // at most 3, largest first
  std::optional<double> l1_hit_pct, l2_hit_pct;
  std::optional<double> bank_conflicts_ld, bank_conflicts_st, shared_wavefronts_ld, shared_wavefronts_st;
  std::optional<double> local_bytes_ld, local_bytes_st, spill_instructions;
  std::optional<double> hmma_instructions, gmma_instructions, tensor_pipe_pct;
  std::vector<Advice> advice;  // ranked, most impactful first
};

// Thresholds of the classification (documented here because the advice quotes them).
inline constexpr double kBusyPct = 60.0;       // a unit above this share of its peak is the bound
inline constexpr double kLaunchBoundUs = 5.0;  // kernels shorter than this, with no busy unit, are launch-bound
inline constexpr double kNearRooflinePct = 80.0;

KernelAnalysis analyze_kernel(const KernelLaunch& k, const AnalysisOptions& options);

// ---- 4. runner ----

// The executable to run: `explicit_path` when given (it must exist and be executable), else `ncu` on
// `path_env` (a PATH value), else /usr/local/cuda/bin/ncu. The error names every place searched and the
// --ncu flag.
std::string locate_ncu(const std::string& explicit_path, const std::string& path_env);

struct NcuInvocation {
  std::string ncu;                    // path of the ncu executable
  std::vector<std::string> workload;  // argv of the profiled process
  std::string kernel_regex;           // ncu --kernel-name regex, matched against demangled names
  int launch_skip = 0;                // matching launches skipped before profiling starts
  int launch_count = 1;               // matching launches profiled
  std::vector<std::string> metrics;
  std::string log_file;  // where ncu writes its own output (the CSV); the workload's output stays apart
};

// argv of the ncu command (ncu first). Always --clock-control none (the GPU's clocks are left as they
// are) and --cache-control all (caches flushed before every replay pass, so each pass sees the same cold
// state and the counters of different passes agree).
std::vector<std::string> ncu_argv(const NcuInvocation& inv);
// The argv as one /bin/sh command line, each argument single-quoted.
std::string shell_join(const std::vector<std::string>& argv);

// Reads ncu's output for known failures; returns an explanation with the fix, or "" when none is found.
// `kernel_regex` is quoted in the no-kernel-matched message.
std::string diagnose_ncu_output(const std::string& output, const std::string& kernel_regex);
// Metrics of `requested` that the output says this ncu/GPU does not have ("Failed to find metric ...").
std::vector<std::string> unknown_metrics(const std::string& output, const std::vector<std::string>& requested);

struct NcuResult {
  std::string command;  // the shell command that produced the capture
  std::string csv;      // ncu's output (the CSV with its ==PROF== lines)
  std::vector<KernelLaunch> launches;
  std::vector<std::string> dropped_metrics;  // requested but unknown to this ncu (retried without them)
};

// Runs ncu and parses its CSV. A metric this ncu does not know is dropped and the run retried (up to 8
// times). Any other failure throws kbn::Error with the diagnosis, the command and the tail of the output.
NcuResult run_ncu(NcuInvocation inv);

// The last line of `ncu --version` ("Version 2025.3.1.0 (build ...)"), or "" when it cannot be run.
std::string ncu_version(const std::string& ncu);

// Calls of the op `kb_nano kernels --seeds S` makes before its first timed call, counted in the kernels ncu
// matches: with `candidate`, the candidate's own calls (validation, then the timing warm-up after the
// baseline was timed); otherwise both baseline instances' calls (the baseline validated against a second
// instance of itself). tests/cpu/test_validate.cpp counts the real calls and checks this stays in step with
// bench/validate.cpp.
int calls_before_timing(int64_t input_bytes, bool candidate, int validation_seeds);

}  // namespace kbn::bench
