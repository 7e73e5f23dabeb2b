#pragma once
// `kb_nano report`: result files of `kb_nano eval --json` and `kb_nano kernels --json` turned into SVG plots
// and an index (Markdown and HTML) that a person opens without any tool beyond a browser.
//
// Three parts, each usable alone:
//   1. reading a result file: the kind is told by its structure (eval: 'config' and 'results'; kernels:
//      'rows'), and every missing or mistyped key is an error naming the file and the key's path;
//   2. a small SVG writer for grouped bar charts (axes, ticks, labels, legend, value labels, a reference
//      line, per-bar colours, linear or log scale), several panels to a figure;
//   3. the report: which figures each kind of result gets, and the index with the key numbers.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace kbn::bench {

// ---- 1. result files ----

struct Percentiles {
  int64_t count = 0;  // samples; 0 when the metric has none (TPOT of one-token outputs)
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

struct EvalVariant {
  std::string name;  // "baseline", "candidate"
  int64_t num_requests = 0, prompt_tokens = 0, output_tokens = 0;
  double duration_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0, requests_per_s = 0;
  Percentiles ttft_s, tpot_s, itl_s, e2e_s;
  // eval --kernel-trace: GPU seconds per kb-nano op, descending, and the traced interval.
  bool has_kernel_trace = false;
  double trace_wall_s = 0, trace_kernel_s = 0, trace_busy_s = 0;  // busy: the busiest device
  std::vector<std::pair<std::string, double>> op_seconds;
  // The busy time attributed to each op (the oldest kernel running is charged; engine/kernel_trace.h), in op_seconds'
  // order; empty for files written before the trace had it.
  std::vector<std::pair<std::string, double>> op_attributed_s;
  // eval on a GPU: the run's serial floor (engine/serial_floor.h), its parts, and floor / duration; files written
  // before eval had it, or by a CPU run (no_floor_reason says why), have none.
  bool has_serial_floor = false;
  double floor_s = 0, floor_gemm_s = 0, floor_kv_read_s = 0, floor_attention_flops_s = 0;
  double floor_achieved = 0;  // floor_s / duration_s
  std::string no_floor_reason;
  std::vector<std::pair<std::string, double>> op_floor_s;  // the floor's share per op
  // The traced seconds of the ops doing each floor op's work (eval's serial_floor.by_op[].kernel_s: linear's include
  // rms_norm_gemv's), where the run was traced; absent ops fall back to the op's own traced seconds.
  std::vector<std::pair<std::string, double>> op_floor_kernel_s;
};

struct EvalAlignment {
  int64_t requests = 0, exact_match = 0, min_matching_prefix = 0;
  double exact_match_rate = 0;               // 0..1
  double mean_matching_prefix = 0;           // tokens
  double mean_matching_prefix_fraction = 0;  // of the baseline's output length, 0..1
  // The baseline's judgement of the first divergences (eval --divergence-samples), when the file has it.
  bool has_divergences = false;
  int64_t diverged = 0, scored = 0;
  double median_margin_over_std = 0, max_margin_over_std = 0;  // baseline's logit margin, in stds of its logits
  double rank2_fraction = 0;                                    // candidate's token = baseline's 1st or 2nd choice
};

struct EvalResult {
  std::string workload, model, device, commit, date;
  std::string mode;                   // eager or graph ("" in files written before the engine had modes)
  std::vector<EvalVariant> variants;  // baseline first
  bool has_alignment = false;
  EvalAlignment alignment;
  const EvalVariant* find(std::string_view variant) const;
};

struct KernelTiming {
  bool timed = false;
  double median_ms = 0;
};

struct KernelRow {
  std::string op, model, label;
  int64_t tp = 1, tokens = 0;
  std::string verdict;  // PASS, FAIL, ERROR, or "-" (not validated)
  std::string reason;   // why it failed, if it did
  KernelTiming baseline, candidate;
  double speedup = 0;                   // baseline / candidate time; 0 when either was not timed
  double pct_copy = -1, pct_bf16 = -1;  // % of the measured ceilings; -1 when the run had no roofline
};

struct KernelsResult {
  std::string device, commit, date, mode;
  double copy_gb_per_s = 0, bf16_tflop_per_s = 0;  // the ceilings measured by the run, 0 when none (CPU)
  bool compare = false;                            // baseline vs candidate (some row has a candidate timing)
  std::vector<KernelRow> rows;
};

enum class ResultKind { eval, kernels };

struct ResultFile {
  std::string path;
  ResultKind kind = ResultKind::eval;
  EvalResult eval;        // when kind == eval
  KernelsResult kernels;  // when kind == kernels
};

// Parses the text of a result file; `path` names it in errors. Throws kbn::Error: "PATH: not valid JSON",
// "PATH: not a kb_nano eval or kernels result ... top-level keys are ...", "PATH: missing key 'a.b[2].c'",
// "PATH: key 'a.b' should be a number, got string".
ResultFile parse_result(const std::string& text, const std::string& path);
// Reads and parses a file; a file that cannot be read is an error naming it and the system's reason.
ResultFile load_result(const std::string& path);
// The results a file holds: one, or for a merged kernels file (a top-level 'runs' array of kernels results, as
// tools/h200_tables.py writes and bench/results/h200/kernels_llama-3.1-8b_tp1_cold.json is) one per run, each named
// "PATH runs[i]" plus the run's 'file' when it has one.
std::vector<ResultFile> parse_results(const std::string& text, const std::string& path);
std::vector<ResultFile> load_results(const std::string& path);

// ---- 2. SVG charts ----

// Text for XML content and attribute values: & < > " ' become entities, and control characters other than
// tab and newline (invalid in XML 1.0) are dropped.
std::string xml_escape(std::string_view text);

inline constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

struct BarSeries {
  std::string name;
  std::string colour;                // "#4e79a7"
  std::vector<double> values;        // one per category; kNoValue draws no bar
  std::vector<std::string> colours;  // per-bar colour overriding `colour` (PASS/FAIL); empty = none
  std::vector<std::string> notes;    // per category, written where a bar is missing ("FAIL"); empty = none
};

struct LegendEntry {
  std::string label, colour;
  bool line = false;  // a dashed line (the reference) instead of a swatch
};

struct BarPanel {
  std::string title;
  std::string y_label;
  std::vector<std::string> categories;
  std::vector<BarSeries> series;
  std::string value_suffix;  // appended to value labels: "x", "%"
  bool has_reference = false;
  double reference = 0;  // a dashed horizontal line (1.0x speedup, 100% of a ceiling)
  std::string reference_label;
  bool log_scale = false;           // decades; values <= 0 draw no bar
  std::vector<LegendEntry> legend;  // empty: one entry per series when there are several
};

struct Figure {
  std::string title;
  std::string subtitle;  // lines separated by '\n'
  std::vector<BarPanel> panels;
  int columns = 2;  // panels per row
};

// A standalone SVG document (XML prolog, white background, no external references). Every bar is a
// <rect class="bar"> with a <title> tooltip; every value label a <text class="value">.
std::string render_svg(const Figure& figure);

// ---- 3. the report ----

struct Plot {
  std::string file;  // name inside the output folder: "eval_throughput.svg"
  std::string caption;
  Figure figure;
};

// Eval results, one workload each (several files, or the same workload twice, are columns side by side):
//   eval_throughput.svg            output and total tokens/s per workload, baseline vs candidate
//   eval_latency_<workload>.svg    TTFT, TPOT, ITL and E2E p50/p90/p99 in ms, baseline vs candidate
//   eval_alignment.svg             exact-match rate and mean matching prefix per workload (when compared)
//   eval_serial_floor.svg          % of the serial floor reached, and measured vs floor seconds (files with one)
//   eval_kernel_time_<workload>.svg  GPU seconds per op and idle time, per variant, beside each op's share of the
//                                  serial floor when the file has one (files with a kernel trace)
std::vector<Plot> eval_plots(const std::vector<const ResultFile*>& files);
// One kernels result; per (op, model, tp) group, named kernels_<op>_<model>_tp<N>_*:
//   _speedup.svg  speedup per case, PASS/FAIL coloured, 1.0x line (baseline vs candidate runs only)
//   _time.svg     median time per case, baseline vs candidate (log scale when times span > 100x)
//   _ceiling.svg  % of the copy-bandwidth and bf16 ceilings per case (runs with a roofline only)
std::vector<Plot> kernels_plots(const ResultFile& file);

struct ReportOptions {
  std::string out_dir = "report";
  std::string title = "kb_nano report";
};

// Writes every plot and index.md / index.html (the plots, and tables of the key numbers) into out_dir,
// creating it; returns the paths written, index.html last.
std::vector<std::string> write_report(const std::vector<ResultFile>& files, const ReportOptions& options);

}  // namespace kbn::bench
