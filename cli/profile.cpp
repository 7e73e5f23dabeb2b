// kb_nano profile: runs one op's kernels under Nsight Compute for chosen cases and turns the counters into a
// report, baseline and candidate side by side, advice first (bench/profile.h holds the metrics, the parser
// and the analysis).
//
// The profiled process is this binary's own `kernels` command on one case in hot mode:
//   kb_nano kernels --target OP --model M --tp N --tokens T --case LABEL --dtype D --mode hot --seeds 1
//                   --variant baseline|candidate
// ncu selects the kernels whose demangled names contain `kbn::<variant>::` (every task kernel lives in that
// namespace; the RNG, conversion, copy-ceiling and cuBLASLt kernels do not). Which launch to profile follows
// from the `kernels` contract (bench/validate.h, bench/timing.h): the op is called by the validation runs and
// the warm-up before the timed calls, and calls_before_timing() counts those calls so that ncu skips them.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench/cases.h"
#include "bench/profile.h"
#include "bench/sass_profile.h"
#include "bench/timing.h"
#include "bench/validate.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "kbn/device.h"
#include "kbn/dtype.h"
#include "kbn/error.h"
#include "kbn/format.h"
#include "kbn/registry.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

struct Options {
  std::string target;
  std::string model = "llama-3.1-8b-instruct";
  int64_t tp = 1;
  std::string tokens;
  std::vector<std::string> case_labels;
  std::string dtype = "bf16";
  std::string variant;  // empty: both when a candidate is compiled in, else baseline
  std::string ncu;
  std::string kernel_regex;  // default: kbn::<variant>::
  int launch_skip = -1;      // -1: calls_before_timing()
  int launch_count = 4;
  std::string json;
  std::string markdown;
  std::string save_csv;
  std::string from_csv;
  std::string candidate_csv;
  std::string sass_csv;
  int top = 12;
};

// Ops whose main kernel multiplies matrices, so tensor-core instructions are expected in it.
bool matrix_op(const std::string& op) {
  return op == "linear" || op == "flash_attn_prefill" || op == "flash_attn_decode";
}

struct VariantResult {
  std::string variant;   // "baseline", "candidate"
  std::string source;    // the ncu command, or the CSV file analysed
  int launch_skip = -1;  // matching launches ncu skipped (-1: analysed from a CSV)
  std::vector<std::string> dropped_metrics;
  std::string error;  // why there is no data
  std::vector<bench::KernelProfile> kernels;
  std::vector<bench::KernelAnalysis> analyses;
  std::string csv;  // the raw capture
};

struct CaseResult {
  std::string op, model, label;
  int64_t tp = 1, tokens = 0, ideal_bytes = 0;
  std::vector<VariantResult> variants;
};

std::string opt(const std::optional<double>& v, const char* f) { return v ? fmt(f, *v) : "n/a"; }

std::string bytes(const std::optional<double>& v) {
  if (!v) return "n/a";
  if (*v >= 1e9) return fmt("%.2f GB", *v / 1e9);
  if (*v >= 1e6) return fmt("%.1f MB", *v / 1e6);
  if (*v >= 1e3) return fmt("%.1f KB", *v / 1e3);
  return fmt("%.0f B", *v);
}

std::string count(const std::optional<double>& v) {
  if (!v) return "n/a";
  if (*v >= 1e6) return fmt("%.2fM", *v / 1e6);
  if (*v >= 1e3) return fmt("%.1fK", *v / 1e3);
  return fmt("%.0f", *v);
}

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

// Analyses the kernels of one capture. The matrix expectation goes to the longest kernel only (a decode
// attention's reduce kernel multiplies nothing), and the ideal bytes only when the op runs one kernel.
void analyse(VariantResult& v, const std::vector<bench::KernelLaunch>& launches, const std::string& op,
             int64_t ideal_bytes) {
  v.kernels = bench::group_launches(launches);
  size_t longest = 0;
  for (size_t i = 0; i < v.kernels.size(); ++i)
    if (v.kernels[i].representative.get("gpu__time_duration.sum").value_or(0) >
        v.kernels[longest].representative.get("gpu__time_duration.sum").value_or(0))
      longest = i;
  for (size_t i = 0; i < v.kernels.size(); ++i) {
    bench::AnalysisOptions o;
    o.matrix_op = matrix_op(op) && i == longest;
    o.ideal_bytes = v.kernels.size() == 1 ? ideal_bytes : 0;
    v.analyses.push_back(bench::analyze_kernel(v.kernels[i].representative, o));
  }
}

std::optional<double> total_us(const VariantResult& v) {
  if (v.analyses.empty()) return std::nullopt;
  double t = 0;
  for (const auto& a : v.analyses) {
    if (!a.duration_us) return std::nullopt;
    t += *a.duration_us;
  }
  return t;
}

// ---- report ----

struct Column {
  const VariantResult* v;
  size_t k;
};

std::vector<Column> columns(const CaseResult& c) {
  std::vector<Column> out;
  for (const auto& v : c.variants)
    for (size_t k = 0; k < v.kernels.size(); ++k) out.push_back({&v, k});
  return out;
}

using Row =
    std::pair<std::string, std::function<std::string(const bench::KernelProfile&, const bench::KernelAnalysis&)>>;

const std::vector<Row>& table_rows() {
  using P = bench::KernelProfile;
  using A = bench::KernelAnalysis;
  static const std::vector<Row> rows = {
      {"duration (us, under ncu)", [](const P&, const A& a) { return opt(a.duration_us, "%.2f"); }},
      {"bound", [](const P&, const A& a) { return std::string(bench::bound_name(a.bound)); }},
      {"DRAM % of peak", [](const P&, const A& a) { return opt(a.dram_pct, "%.1f"); }},
      {"SM % of peak", [](const P&, const A& a) { return opt(a.sm_pct, "%.1f"); }},
      {"L1/L2/shared/DRAM max %", [](const P&, const A& a) { return opt(a.memory_pct, "%.1f"); }},
      {"DRAM read / write",
       [](const P&, const A& a) { return bytes(a.dram_read_bytes) + " / " + bytes(a.dram_write_bytes); }},
      {"occupancy achieved / theor. %",
       [](const P&, const A& a) {
         return opt(a.achieved_occupancy_pct, "%.1f") + " / " + opt(a.theoretical_occupancy_pct, "%.1f");
       }},
      {"occupancy limiter",
       [](const P&, const A& a) {
         if (a.occupancy_limiter.empty()) return std::string("n/a");
         return a.occupancy_limiter + (a.limiter_blocks ? fmt(" (%.0f blocks/SM)", *a.limiter_blocks) : "");
       }},
      {"grid x block",
       [](const P&, const A& a) { return opt(a.grid_size, "%.0f") + " x " + opt(a.block_size, "%.0f"); }},
      {"waves per SM", [](const P&, const A& a) { return opt(a.waves, "%.2f"); }},
      {"registers / thread", [](const P&, const A& a) { return opt(a.registers_per_thread, "%.0f"); }},
      {"shared memory / block", [](const P&, const A& a) { return bytes(a.shared_bytes_per_block); }},
      {"stall 1 (% of stall cycles)",
       [](const P&, const A& a) {
         return a.top_stalls.size() > 0 ? a.top_stalls[0].reason + fmt(" %.0f", a.top_stalls[0].share_pct) : "-";
       }},
      {"stall 2",
       [](const P&, const A& a) {
         return a.top_stalls.size() > 1 ? a.top_stalls[1].reason + fmt(" %.0f", a.top_stalls[1].share_pct) : "-";
       }},
      {"stall 3",
       [](const P&, const A& a) {
         return a.top_stalls.size() > 2 ? a.top_stalls[2].reason + fmt(" %.0f", a.top_stalls[2].share_pct) : "-";
       }},
      {"L1 / L2 hit %",
       [](const P&, const A& a) { return opt(a.l1_hit_pct, "%.1f") + " / " + opt(a.l2_hit_pct, "%.1f"); }},
      {"smem bank conflicts ld / st",
       [](const P&, const A& a) { return count(a.bank_conflicts_ld) + " / " + count(a.bank_conflicts_st); }},
      {"local memory ld / st",
       [](const P&, const A& a) { return bytes(a.local_bytes_ld) + " / " + bytes(a.local_bytes_st); }},
      {"spill instructions", [](const P&, const A& a) { return count(a.spill_instructions); }},
      {"HMMA / GMMA instructions",
       [](const P&, const A& a) { return count(a.hmma_instructions) + " / " + count(a.gmma_instructions); }},
      {"tensor pipe % active", [](const P&, const A& a) { return opt(a.tensor_pipe_pct, "%.1f"); }},
      {"launches profiled", [](const P& p, const A&) { return std::to_string(p.launches); }},
  };
  return rows;
}

std::string case_title(const CaseResult& c) {
  std::string t = c.op.empty() ? "(capture)" : c.op;
  if (!c.model.empty()) t += "  " + c.model + "  tp=" + std::to_string(c.tp);
  return t + "  " + c.label;
}

// Advice first: per variant and kernel, the ranked lines; then the time comparison.
std::vector<std::string> advice_lines(const CaseResult& c, size_t max_lines) {
  std::vector<std::string> out;
  for (const auto& v : c.variants) {
    if (!v.error.empty()) {
      out.push_back(v.variant + ": no profile: " + v.error);
      continue;
    }
    for (size_t k = 0; k < v.kernels.size(); ++k) {
      const auto& a = v.analyses[k];
      out.push_back(v.variant + "  " + v.kernels[k].short_name + "  [" + bench::bound_name(a.bound) + ": " +
                    a.bound_detail + "]");
      if (a.advice.empty()) out.push_back("  - nothing stands out");
      for (size_t i = 0; i < a.advice.size() && i < max_lines; ++i)
        out.push_back("  " + std::to_string(i + 1) + ". " + a.advice[i].text);
    }
    if (!v.dropped_metrics.empty()) {
      std::string d;
      for (const auto& m : v.dropped_metrics) d += (d.empty() ? "" : ", ") + m;
      out.push_back("  (this ncu lacks: " + d + ")");
    }
  }
  const VariantResult* base = nullptr;
  const VariantResult* cand = nullptr;
  for (const auto& v : c.variants) (v.variant == "baseline" ? base : cand) = &v;
  auto tb = base ? total_us(*base) : std::nullopt;
  auto tc = cand ? total_us(*cand) : std::nullopt;
  if (tb && tc)
    out.push_back(fmt("kernel time under ncu: baseline %.2f us, ", *tb) + fmt("candidate %.2f us ", *tc) +
                  fmt("(%+.1f%%)", 100.0 * (*tc - *tb) / *tb));
  for (const auto* v : {base, cand}) {
    if (!v || v->kernels.size() < 2 || c.ideal_bytes <= 0) continue;
    double moved = 0;
    for (const auto& a : v->analyses) moved += a.dram_read_bytes.value_or(0) + a.dram_write_bytes.value_or(0);
    out.push_back(v->variant + ": DRAM traffic of all kernels " + bytes(moved) +
                  fmt(" = %.2fx", moved / c.ideal_bytes) + " the ideal " + bytes(double(c.ideal_bytes)));
  }
  return out;
}

std::vector<std::vector<std::string>> table(const CaseResult& c) {
  std::vector<std::vector<std::string>> t;
  std::vector<std::string> head = {"metric"};
  for (const auto& col : columns(c)) head.push_back(col.v->variant + ": " + clip(col.v->kernels[col.k].short_name, 56));
  t.push_back(head);
  for (const auto& [label, cell] : table_rows()) {
    std::vector<std::string> r = {label};
    for (const auto& col : columns(c)) r.push_back(cell(col.v->kernels[col.k], col.v->analyses[col.k]));
    t.push_back(r);
  }
  return t;
}

void print_case(const CaseResult& c) {
  std::printf("\n== %s ==\n\nAdvice (most impactful first)\n", case_title(c).c_str());
  for (const auto& l : advice_lines(c, 5)) std::printf("%s\n", l.c_str());
  if (columns(c).empty()) return;
  const auto t = table(c);
  std::vector<size_t> width(t[0].size(), 0);
  for (const auto& r : t)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::printf("\n");
  for (const auto& r : t) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i)
      line += r[i] + (i + 1 < r.size() ? std::string(width[i] - r[i].size() + 3, ' ') : "");
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void write_markdown(const std::string& path, const std::vector<CaseResult>& cases, const nlohmann::json& prov) {
  std::ofstream md(path);
  KBN_CHECK(md.good(), "--markdown: cannot write '", path, "'");
  md << "# kb_nano profile\n\n"
     << prov.value("ncu_version", std::string("ncu")) << "; commit " << prov.value("commit", std::string("?")) << "; "
     << prov.value("date", std::string("")) << "\n";
  for (const auto& c : cases) {
    md << "\n## " << case_title(c) << "\n\n";
    for (const auto& l : advice_lines(c, 5)) md << (l.rfind("  ", 0) == 0 ? "   " + l.substr(2) : "- " + l) << "\n";
    if (columns(c).empty()) continue;
    const auto t = table(c);
    md << "\n|";
    for (const auto& h : t[0]) md << " " << h << " |";
    md << "\n|";
    for (size_t i = 0; i < t[0].size(); ++i) md << " --- |";
    md << "\n";
    for (size_t r = 1; r < t.size(); ++r) {
      md << "|";
      for (const auto& cell : t[r]) md << " " << cell << " |";
      md << "\n";
    }
  }
}

nlohmann::json optional_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

nlohmann::json analysis_json(const bench::KernelAnalysis& a) {
  nlohmann::json j;
  j["bound"] = bench::bound_name(a.bound);
  j["bound_detail"] = a.bound_detail;
  j["duration_us"] = optional_json(a.duration_us);
  j["dram_pct"] = optional_json(a.dram_pct);
  j["sm_pct"] = optional_json(a.sm_pct);
  j["memory_pct"] = optional_json(a.memory_pct);
  j["dram_read_bytes"] = optional_json(a.dram_read_bytes);
  j["dram_write_bytes"] = optional_json(a.dram_write_bytes);
  j["achieved_occupancy_pct"] = optional_json(a.achieved_occupancy_pct);
  j["theoretical_occupancy_pct"] = optional_json(a.theoretical_occupancy_pct);
  j["occupancy_limiter"] = a.occupancy_limiter;
  j["occupancy_limiter_blocks_per_sm"] = optional_json(a.limiter_blocks);
  j["registers_per_thread"] = optional_json(a.registers_per_thread);
  j["grid_size"] = optional_json(a.grid_size);
  j["block_size"] = optional_json(a.block_size);
  j["shared_bytes_per_block"] = optional_json(a.shared_bytes_per_block);
  j["waves_per_sm"] = optional_json(a.waves);
  j["sm_count"] = a.sm_count;
  j["top_stalls"] = nlohmann::json::array();
  for (const auto& s : a.top_stalls)
    j["top_stalls"].push_back(
        {{"reason", s.reason}, {"cycles_per_issue", s.cycles_per_issue}, {"share_pct", s.share_pct}});
  j["l1_hit_pct"] = optional_json(a.l1_hit_pct);
  j["l2_hit_pct"] = optional_json(a.l2_hit_pct);
  j["bank_conflicts_ld"] = optional_json(a.bank_conflicts_ld);
  j["bank_conflicts_st"] = optional_json(a.bank_conflicts_st);
  j["local_bytes_ld"] = optional_json(a.local_bytes_ld);
  j["local_bytes_st"] = optional_json(a.local_bytes_st);
  j["spill_instructions"] = optional_json(a.spill_instructions);
  j["hmma_instructions"] = optional_json(a.hmma_instructions);
  j["gmma_instructions"] = optional_json(a.gmma_instructions);
  j["tensor_pipe_pct"] = optional_json(a.tensor_pipe_pct);
  j["advice"] = nlohmann::json::array();
  for (const auto& ad : a.advice) j["advice"].push_back({{"score", ad.score}, {"text", ad.text}});
  return j;
}

nlohmann::json case_json(const CaseResult& c) {
  nlohmann::json j = {{"op", c.op},      {"model", c.model},   {"tp", c.tp},
                      {"case", c.label}, {"tokens", c.tokens}, {"ideal_bytes", c.ideal_bytes}};
  j["variants"] = nlohmann::json::array();
  for (const auto& v : c.variants) {
    nlohmann::json vj = {{"variant", v.variant}, {"source", v.source}, {"dropped_metrics", v.dropped_metrics}};
    if (v.launch_skip >= 0) vj["launch_skip"] = v.launch_skip;
    if (!v.error.empty()) vj["error"] = v.error;
    vj["kernels"] = nlohmann::json::array();
    for (size_t k = 0; k < v.kernels.size(); ++k) {
      const auto& p = v.kernels[k];
      nlohmann::json kj = {{"name", p.name},
                           {"short_name", p.short_name},
                           {"launches", p.launches},
                           {"id", p.representative.id},
                           {"grid_size", p.representative.grid_size},
                           {"block_size", p.representative.block_size},
                           {"device", p.representative.device},
                           {"cc", p.representative.cc}};
      nlohmann::json mj = nlohmann::json::object();
      for (const auto& [name, m] : p.representative.metrics)
        mj[name] = {{"value", optional_json(m.value)}, {"unit", m.unit}, {"text", m.text}};
      kj["metrics"] = mj;
      kj["analysis"] = analysis_json(v.analyses[k]);
      vj["kernels"].push_back(kj);
    }
    j["variants"].push_back(vj);
  }
  return j;
}

// ---- running ----

std::vector<int64_t> parse_tokens(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    KBN_CHECK(!tok.empty() && end == tok.c_str() + tok.size() && v > 0,
              "--tokens: expected comma-separated positive integers like 1,8,512, got '", s, "'");
    out.push_back(v);
  }
  return out;
}

std::vector<bench::BenchCase> select_cases(const Options& o) {
  engine::ModelSpec spec = engine::resolve_model(o.model);
  bench::CaseOptions copts;
  copts.tokens = parse_tokens(o.tokens);
  copts.dtype = parse_dtype(o.dtype);
  std::vector<bench::BenchCase> cases =
      bench::cases_for(o.target, bench::model_view(spec.name, spec.config, o.tp), copts);
  if (o.case_labels.empty()) return cases;
  std::vector<bench::BenchCase> kept;
  for (const auto& want : o.case_labels) {
    auto it = std::find_if(cases.begin(), cases.end(), [&](const auto& c) { return c.label == want; });
    KBN_CHECK(it != cases.end(), "--case: no ", o.target, " case is labelled '", want,
              "' (kb_nano kernels --list --target ", o.target, " shows the labels)");
    kept.push_back(*it);
  }
  return kept;
}

std::vector<std::string> variants_of(const std::string& v) {
  if (v.empty())
    return candidate_built() ? std::vector<std::string>{"baseline", "candidate"} : std::vector<std::string>{"baseline"};
  if (v == "baseline") return {"baseline"};
  KBN_CHECK(candidate_built(), "--variant ", v,
            ": this kb_nano has no candidate compiled in (tasks/candidate/ held no task files at build time); "
            "use --variant baseline or add a candidate and rebuild");
  if (v == "candidate") return {"candidate"};
  return {"baseline", "candidate"};
}

// One validation seed: validation is not what is profiled, and each seed adds calls before the timed ones.
constexpr int kValidationSeeds = 1;

// The profiled process: `kb_nano kernels` on exactly this case, hot, in the chosen variant. With --variant
// candidate, `kernels` runs the baseline too (it validates and times both); the kernel regex keeps ncu on
// the candidate's kernels.
std::vector<std::string> workload(const std::string& exe, const bench::BenchCase& c, const std::string& variant) {
  return {exe,         "kernels",
          "--target",  c.op,
          "--model",   c.model,
          "--tp",      std::to_string(c.tp),
          "--tokens",  std::to_string(c.tokens),
          "--case",    c.label,
          "--dtype",   dtype_name(c.dtype),
          "--mode",    "hot",
          "--seeds",   std::to_string(kValidationSeeds),
          "--variant", variant,
          // ncu counts launches in the process it starts: the op under test stays in that process.
          "--in-process"};
}

// Calls of the profiled variant's op before its first timed call, as `kernels` makes them
// (validate_candidate() in bench/validate.cpp, then time_op()'s warm-up):
//   seed 0 runs every input distribution (only the normal one when inputs exceed max_distribution_bytes),
//   later seeds the normal one; each run calls the validated op once, and in baseline-only mode the
//   reference is a second baseline instance, so the baseline namespace sees two calls per run;
//   the first run adds a fresh-values rerun (validated op and reference) and a determinism rerun;
//   then the warm-up calls.
// Launches = calls x kernels per call; skipping `calls` launches is exact for one-kernel ops, and for ops of
// several kernels per call it lands among the validation calls, which run the same kernels on the same shapes.
// ncu slows each profiled call far past the 200 ms timing budget, so the timed loop stops at its minimum of
// 10 calls: the profiled launches must fall within them (the default --launch-count 4 does).
int calls_before_timing(const bench::BenchCase& c, bool candidate) {
  return bench::calls_before_timing(c.input_bytes, candidate, kValidationSeeds);
}

std::string file_slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path);
  KBN_CHECK(in.good(), flag, ": cannot read '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<CaseResult> from_csv(const Options& o) {
  CaseResult c;
  c.op = o.target;
  c.label = std::filesystem::path(o.from_csv).filename().string();
  // With one named case the ideal bytes are known and the DRAM traffic can be judged against them.
  if (!o.target.empty() && o.case_labels.size() == 1) {
    const bench::BenchCase bc = select_cases(o).front();
    c.model = bc.model;
    c.label = bc.label;
    c.tp = bc.tp;
    c.tokens = bc.tokens;
    c.ideal_bytes = bc.bytes;
  }
  for (const auto& [variant, path, flag] : {std::tuple{std::string("baseline"), o.from_csv, "--from-csv"},
                                            std::tuple{std::string("candidate"), o.candidate_csv, "--candidate-csv"}}) {
    if (path.empty()) continue;
    VariantResult v;
    v.variant = variant;
    v.source = path;
    v.csv = read_file(path, flag);
    analyse(v, bench::parse_ncu_csv(v.csv), c.op, c.ideal_bytes);
    KBN_CHECK(!v.kernels.empty(), flag, ": '", path, "' holds no kernel rows");
    c.variants.push_back(std::move(v));
  }
  return {c};
}

std::vector<CaseResult> profile(const Options& o, std::string& ncu_path) {
  KBN_CHECK(!o.target.empty(), "kb_nano profile: --target OP is required (or --from-csv FILE to analyse a capture)");
  const std::vector<bench::BenchCase> cases = select_cases(o);
  KBN_CHECK(!cases.empty(), "kb_nano profile: no ", o.target, " cases selected (check --tokens and --case)");
  const std::vector<std::string> variants = variants_of(o.variant);
  const char* path_env = std::getenv("PATH");
  ncu_path = bench::locate_ncu(o.ncu, path_env ? path_env : "");
  KBN_CHECK(cuda_available(), "kb_nano profile runs the op's kernels under ncu, and no GPU is visible to this ",
            build_info().with_cuda ? "process" : "CPU-only build",
            "; --from-csv FILE analyses a capture made elsewhere");
  if (!o.save_csv.empty()) std::filesystem::create_directories(o.save_csv);
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();

  std::vector<CaseResult> out;
  size_t run = 0;
  for (const auto& c : cases) {
    CaseResult r{c.op, c.model, c.label, c.tp, c.tokens, c.bytes, {}};
    for (const auto& variant : variants) {
      std::fprintf(stderr, "[%zu/%zu] %s %s %s: ncu...\n", ++run, cases.size() * variants.size(), c.op.c_str(),
                   c.label.c_str(), variant.c_str());
      bench::NcuInvocation inv;
      inv.ncu = ncu_path;
      inv.workload = workload(exe, c, variant);
      inv.kernel_regex = o.kernel_regex.empty() ? "kbn::" + variant + "::" : o.kernel_regex;
      inv.launch_skip = o.launch_skip >= 0 ? o.launch_skip : calls_before_timing(c, variant == "candidate");
      inv.launch_count = o.launch_count;
      inv.metrics = bench::profile_metrics();
      VariantResult v;
      v.variant = variant;
      v.launch_skip = inv.launch_skip;
      try {
        bench::NcuResult res = bench::run_ncu(inv);
        v.source = res.command;
        v.dropped_metrics = res.dropped_metrics;
        v.csv = res.csv;
        analyse(v, res.launches, c.op, c.bytes);
      } catch (const Error& e) {
        // The same refusal would repeat for every case; stop at the first.
        if (std::string(e.what()).find("ERR_NVGPUCTRPERM") != std::string::npos) throw;
        v.source = bench::shell_join(bench::ncu_argv(inv));
        v.error = e.what();
        std::fprintf(stderr, "kb_nano profile: %s\n", v.error.c_str());
      }
      if (!o.save_csv.empty() && !v.csv.empty()) {
        const std::string path = o.save_csv + "/" + c.op + "__" + variant + "__" + file_slug(c.label) + ".csv";
        std::ofstream(path) << v.csv;
        std::fprintf(stderr, "kb_nano profile: raw capture in %s\n", path.c_str());
      }
      r.variants.push_back(std::move(v));
    }
    print_case(r);
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json sass_json(const bench::SassKernel& k, size_t top) {
  nlohmann::json hot = nlohmann::json::array(), regions = nlohmann::json::array();
  for (size_t i : bench::hot_instructions(k, top)) {
    const bench::SassInstruction& ins = k.instructions[i];
    hot.push_back({{"index", i},
                   {"address", ins.address},
                   {"source", ins.source},
                   {"samples", ins.samples},
                   {"executed", ins.executed},
                   {"stalls", ins.stalls}});
  }
  for (const bench::SassRegion& r : bench::hot_regions(k, top)) {
    nlohmann::json stalls = nlohmann::json::object();
    for (const auto& [reason, n] : r.top_stalls) stalls[reason] = n;
    regions.push_back({{"first", r.first},
                       {"last", r.last},
                       {"ends_at", k.instructions[r.last].source},
                       {"samples", r.samples},
                       {"executed", r.executed},
                       {"top_stalls", stalls}});
  }
  return {{"name", k.name},         {"instructions", k.instructions.size()},
          {"samples", k.samples()}, {"executed", k.executed()},
          {"stalls", k.stalls()},   {"hot_instructions", hot},
          {"regions", regions}};
}

// --sass-csv: the per-instruction view of a capture made with --set full --import-source yes.
void run_sass(const Options& o) {
  KBN_CHECK(o.from_csv.empty() && o.target.empty(),
            "--sass-csv analyses a source-page capture on its own: drop --from-csv / --target");
  const std::vector<bench::SassKernel> kernels = bench::parse_ncu_source_csv(read_file(o.sass_csv, "--sass-csv"));
  std::fputs(bench::sass_report(kernels, size_t(o.top)).c_str(), stdout);
  if (!o.json.empty()) {
    const BuildInfo& b = build_info();
    nlohmann::json j;
    j["provenance"] = {{"commit", b.git_commit}, {"date", utc_now()}, {"source", o.sass_csv}};
    j["kernels"] = nlohmann::json::array();
    for (const auto& k : kernels) j["kernels"].push_back(sass_json(k, size_t(o.top)));
    std::ofstream out(o.json);
    KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
    out << j.dump(2) << "\n";
  }
}

void run(const Options& o) {
  // Output paths first: a typo must not cost the ncu runs.
  check_output_file("--json", o.json);
  if (!o.sass_csv.empty()) {
    KBN_CHECK(o.markdown.empty() && o.save_csv.empty(), "--sass-csv writes its report to the console and --json only");
    run_sass(o);
    return;
  }
  check_output_file("--markdown", o.markdown);
  check_output_dir("--save-csv", o.save_csv);
  KBN_CHECK(o.launch_count >= 1, "--launch-count: expected at least 1, got ", o.launch_count);
  KBN_CHECK(o.candidate_csv.empty() || !o.from_csv.empty(), "--candidate-csv needs --from-csv for the baseline");
  std::string ncu_path;
  std::vector<CaseResult> cases;
  if (!o.from_csv.empty()) {
    cases = from_csv(o);
    for (const auto& c : cases) print_case(c);
  } else {
    cases = profile(o, ncu_path);
  }

  const BuildInfo& b = build_info();
  nlohmann::json prov = {{"commit", b.git_commit},
                         {"build_type", b.build_type},
                         {"cuda_version", b.cuda_version},
                         {"date", utc_now()},
                         {"source", o.from_csv.empty() ? "ncu" : "csv"},
                         {"metrics_requested", bench::profile_metrics()}};
  if (!ncu_path.empty()) {
    prov["ncu"] = ncu_path;
    prov["ncu_version"] = bench::ncu_version(ncu_path);
    prov["launch_skip"] = o.launch_skip >= 0 ? nlohmann::json(o.launch_skip) : nlohmann::json("per case");
    prov["launch_count"] = o.launch_count;
  }
  prov["thresholds"] = {{"busy_pct", bench::kBusyPct},
                        {"launch_bound_us", bench::kLaunchBoundUs},
                        {"near_roofline_pct", bench::kNearRooflinePct}};
  if (!o.json.empty()) {
    nlohmann::json j;
    j["provenance"] = prov;
    j["cases"] = nlohmann::json::array();
    for (const auto& c : cases) j["cases"].push_back(case_json(c));
    std::ofstream out(o.json);
    KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
    out << j.dump(2) << "\n";
  }
  if (!o.markdown.empty()) write_markdown(o.markdown, cases, prov);
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Run an op's kernels under Nsight Compute (ncu --clock-control none) and report what bounds them, "
      "occupancy, stalls, caches, spills and tensor-core use, baseline and candidate side by side");
  cmd->add_option("--target", o->target, "Op to profile (registry name, e.g. rms_norm, flash_attn_prefill)");
  cmd->add_option("--model", o->model, "Model name from models/ whose shapes are used (default llama-3.1-8b-instruct)");
  cmd->add_option("--tp", o->tp, "Tensor-parallel size whose per-rank shapes are used (default 1)")
      ->check(integer_at_least(1, "a tensor-parallel size"));
  cmd->add_option("--tokens", o->tokens, "Comma-separated token counts replacing the op's defaults");
  cmd->add_option("--case", o->case_labels,
                  "Only the case with this exact label (repeatable; kb_nano kernels --list shows them; default: "
                  "every case, one ncu run per case and variant)");
  cmd->add_option("--dtype", o->dtype, "Activation and weight dtype: bf16 (default), f16 or f32");
  cmd->add_option("--variant", o->variant,
                  "baseline, candidate or both (default: both when a candidate is compiled in, else baseline)")
      ->check(one_of({"baseline", "candidate", "both"}));
  cmd->add_option("--ncu", o->ncu, "Path of Nsight Compute's ncu (default: ncu on PATH, then /usr/local/cuda/bin)");
  cmd->add_option("--kernel-regex", o->kernel_regex,
                  "Which kernels to profile, matched against demangled names (default kbn::<variant>::, every "
                  "task kernel; library kernels such as cuBLASLt's need their own regex)");
  cmd->add_option("--launch-skip", o->launch_skip,
                  "Matching launches to skip (default: the validation and warm-up calls that precede the timed "
                  "ones, counted per case)")
      ->check(integer_at_least(0));
  cmd->add_option("--launch-count", o->launch_count, "Matching launches to profile after the skipped ones (default 4)")
      ->check(integer_at_least(1));
  cmd->add_option("--json", o->json, "Write raw metrics and the analysis of every kernel to this file");
  cmd->add_option("--markdown", o->markdown, "Write the report as Markdown to this file");
  cmd->add_option("--save-csv", o->save_csv, "Keep each raw ncu capture in this folder (<op>__<variant>__<case>.csv)");
  cmd->add_option("--from-csv", o->from_csv,
                  "Analyse this capture (ncu --csv --page raw) instead of running ncu; its column is 'baseline'. "
                  "With --target and one --case the DRAM traffic is judged against the case's ideal bytes");
  cmd->add_option("--candidate-csv", o->candidate_csv, "With --from-csv: a second capture, shown as 'candidate'");
  cmd->add_option("--sass-csv", o->sass_csv,
                  "Per-instruction view of one kernel launch instead: the hot SASS instructions and the regions "
                  "between synchronisation points, by warp samples and stall reasons, from ncu's source page "
                  "(ncu --set full --import-source yes -o REP <program>; ncu -i REP.ncu-rep --page source "
                  "--print-source sass --csv > FILE)");
  cmd->add_option("--top", o->top, "With --sass-csv: rows per list (default 12)")->check(integer_at_least(1));
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
