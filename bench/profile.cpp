#include "bench/profile.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "bench/timing.h"
#include "bench/validate.h"
#include "kbn/error.h"

namespace kbn::bench {

// ---- 1. metrics ----
//
// Nsight Compute metric names for sm_90 (H100/H200). The Nsight Compute documentation was not available
// where this list was written, so every name was checked against public scripts and reports that ran ncu
// on Hopper (and, for the launch__ and device__ names, on other architectures too). Names that were seen
// only once or only in scripts (not in captured output) are marked "unconfirmed": if this ncu does not know
// one, run_ncu() drops it and retries, and the report lists it, so a wrong name costs a line of the report,
// not the run.
namespace {
const std::vector<std::string> kStallReasons = {
    "long_scoreboard",
    "short_scoreboard",
    "barrier",
    "mio_throttle",
    "lg_throttle",
    "math_pipe_throttle",
    "wait",
    "not_selected",
    "membar",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "no_instruction",
    "imc_miss",
    "tex_throttle",
    "sleeping",
    "misc",
    "gmma",  // Hopper only: waiting on a warpgroup MMA (wgmma) to complete
};
}  // namespace

const std::vector<std::string>& stall_reasons() { return kStallReasons; }

std::string stall_metric(const std::string& reason) {
  return "smsp__average_warps_issue_stalled_" + reason + "_per_issue_active.ratio";
}

const std::vector<std::string>& profile_metrics() {
  static const std::vector<std::string> m = [] {
    std::vector<std::string> v = {
        // Speed of light: duration, and each unit's throughput as % of its peak.
        "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",  // busiest of DRAM, L2, L1, shared
        "dram__bytes_read.sum", "dram__bytes_write.sum",
        // Launch configuration and occupancy.
        "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
        "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
        "launch__waves_per_multiprocessor", "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks",
        "launch__occupancy_limit_barriers",                   // unconfirmed: seen once, in a Hopper report diff
        "sm__maximum_warps_per_active_cycle_pct",             // theoretical occupancy
        "sm__warps_active.avg.pct_of_peak_sustained_active",  // achieved occupancy
        "device__attribute_multiprocessor_count",
        // Warp state: cycles between issues, and per-reason stalls (appended below).
        "smsp__average_warp_latency_per_inst_issued.ratio",
        // Caches and shared memory.
        "l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        // Local memory (register spills, dynamically indexed arrays).
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
        // Accepted by ncu 2025.3 on the H200 but reported n/a there: the local-memory bytes above are the
        // spill signal that always reads.
        "sass__inst_executed_register_spilling",
        // Tensor cores: mma.sync (HMMA) and Hopper's wgmma (GMMA) instructions, and the pipe's utilisation.
        "sm__inst_executed_pipe_tensor_op_hmma.sum", "sm__inst_executed_pipe_tensor_op_gmma.sum",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",  // read on the H200 (ncu 2025.3)
    };
    // The stall ratios ("gmma" read on the H200 with ncu 2025.3; older ncu versions may lack it, and a metric
    // ncu rejects is dropped and listed in the report rather than failing the run).
    for (const auto& r : kStallReasons) v.push_back(stall_metric(r));
    return v;
  }();
  return m;
}

// ---- 2. parsing ----

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool split_csv(const std::string& line, std::vector<std::string>& out) {
  out.clear();
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cell);
      cell.clear();
    } else if (c != '\r') {
      cell += c;
    }
  }
  out.push_back(cell);
  return !quoted;
}

std::optional<double> parse_number(const std::string& cell) {
  std::string s;
  for (char c : trim(cell))
    if (c != ',') s += c;
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

void normalise_unit(double& value, std::string& unit) {
  const size_t slash = unit.find('/');
  std::string num = slash == std::string::npos ? unit : unit.substr(0, slash);
  const std::string rest = slash == std::string::npos ? "" : unit.substr(slash);
  // Time: ncu's base unit for durations is the nanosecond.
  static const std::map<std::string, double> kTime = {{"nsecond", 1},  {"usecond", 1e3}, {"msecond", 1e6},
                                                      {"second", 1e9}, {"ns", 1},        {"us", 1e3},
                                                      {"ms", 1e6},     {"s", 1e9}};
  if (rest.empty()) {
    auto t = kTime.find(num);
    if (t != kTime.end()) {
      value *= t->second;
      unit = "nsecond";
      return;
    }
  }
  // Decimal prefixes on counted quantities ("Mbyte", "Kinst", "Gbyte/second").
  static const std::set<std::string> kCounted = {"byte", "inst",   "cycle", "sector",    "request",
                                                 "warp", "thread", "block", "wavefront", "transaction"};
  static const std::map<char, double> kPrefix = {{'K', 1e3}, {'M', 1e6}, {'G', 1e9}, {'T', 1e12}, {'P', 1e15}};
  if (num.size() > 1 && kPrefix.count(num[0]) && kCounted.count(num.substr(1))) {
    value *= kPrefix.at(num[0]);
    unit = num.substr(1) + rest;
  }
}

std::optional<double> KernelLaunch::get(const std::string& metric) const {
  auto it = metrics.find(metric);
  if (it == metrics.end()) return std::nullopt;
  return it->second.value;
}

std::vector<KernelLaunch> parse_ncu_csv(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> header, cells, units;
  while (std::getline(in, line)) {
    if (line.rfind("\"ID\",", 0) == 0 && split_csv(line, header)) break;
  }
  KBN_CHECK(!header.empty(),
            "ncu output: no CSV header row (\"ID\",\"Process ID\",...); was it written with --csv --page raw?");
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* required : {"ID", "Kernel Name"})
    KBN_CHECK(col.count(required), "ncu output: the header has no \"", required, "\" column");
  auto cell = [&](const std::vector<std::string>& row, const char* name) -> std::string {
    auto it = col.find(name);
    return it == col.end() ? "" : row[it->second];
  };
  // Metric columns are the ones named like ncu metrics (unit__counter...); the rest describe the launch.
  std::vector<size_t> metric_cols;
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i].find("__") != std::string::npos) metric_cols.push_back(i);

  std::vector<KernelLaunch> out;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '"') continue;  // ==PROF== lines and the profiled program's own output
    if (!split_csv(line, cells) || cells.size() != header.size()) continue;
    if (trim(cells[col["ID"]]).empty()) {  // the units row: no ID, a unit per metric column
      units = cells;
      continue;
    }
    KernelLaunch k;
    k.id = trim(cell(cells, "ID"));
    k.name = cell(cells, "Kernel Name");
    k.block_size = cell(cells, "Block Size");
    k.grid_size = cell(cells, "Grid Size");
    k.device = cell(cells, "Device");
    k.cc = cell(cells, "CC");
    for (size_t i : metric_cols) {
      MetricValue m;
      m.text = cells[i];
      m.unit = units.empty() ? "" : units[i];
      m.value = parse_number(cells[i]);
      if (m.value) normalise_unit(*m.value, m.unit);
      k.metrics[header[i]] = std::move(m);
    }
    out.push_back(std::move(k));
  }
  return out;
}

std::string short_kernel_name(const std::string& name) {
  std::string s = trim(name);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  // Drop the parameter list: the parenthesised group that ends the name (matched from the back, since
  // "(anonymous namespace)" may appear before it).
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s = trim(s.substr(0, i));
        break;
      }
    }
  }
  // Drop the qualifiers: everything up to the last "::" outside template arguments and parentheses.
  int depth = 0;
  size_t cut = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' || c == '(') ++depth;
    // Clamped at 0: ncu 2025.3 writes an anonymous namespace as "unnamed>::" (no opening '<').
    if ((c == '>' || c == ')') && depth > 0) --depth;
    if (depth == 0 && c == ':' && s[i + 1] == ':') cut = i + 2;
  }
  return s.substr(cut);
}

std::vector<KernelProfile> group_launches(const std::vector<KernelLaunch>& launches) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const KernelLaunch*>> groups;
  for (const auto& k : launches) {
    const std::string key = k.name + "|" + k.grid_size + "|" + k.block_size;
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&k);
  }
  std::vector<KernelProfile> out;
  for (const auto& key : order) {
    std::vector<const KernelLaunch*> g = groups[key];
    std::stable_sort(g.begin(), g.end(), [](const KernelLaunch* a, const KernelLaunch* b) {
      return a->get("gpu__time_duration.sum").value_or(0) < b->get("gpu__time_duration.sum").value_or(0);
    });
    KernelProfile p;
    p.name = g.front()->name;
    p.short_name = short_kernel_name(p.name);
    p.launches = int(g.size());
    p.representative = *g[(g.size() - 1) / 2];
    out.push_back(std::move(p));
  }
  return out;
}

// ---- 3. analysis ----

const char* bound_name(Bound b) {
  switch (b) {
    case Bound::memory:
      return "memory";
    case Bound::compute:
      return "compute";
    case Bound::latency:
      return "latency";
    case Bound::launch:
      return "launch";
    case Bound::unknown:
      break;
  }
  return "unknown";
}

namespace {

std::string num(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// One decimal below 20% so that low occupancies (12.5%) and small shares keep their meaning.
std::string pct(double v) { return num(v < 20 ? "%.1f%%" : "%.0f%%", v); }

std::string bytes_str(double b) {
  if (b >= 1e9) return num("%.2f GB", b / 1e9);
  if (b >= 1e6) return num("%.1f MB", b / 1e6);
  if (b >= 1e3) return num("%.1f KB", b / 1e3);
  return num("%.0f B", b);
}

std::string count_str(double v) {
  if (v >= 1e9) return num("%.2fG", v / 1e9);
  if (v >= 1e6) return num("%.2fM", v / 1e6);
  if (v >= 1e3) return num("%.1fK", v / 1e3);
  return num("%.0f", v);
}

// What a warp waiting for this reason waits on, and what usually shortens the wait.
std::string stall_hint(const std::string& reason) {
  static const std::map<std::string, std::string> hints = {
      {"long_scoreboard",
       "results of global/local memory loads; issue loads earlier and keep more of them in flight (unroll, "
       "prefetch into registers, cp.async or TMA pipelines), or raise occupancy"},
      {"short_scoreboard",
       "shared memory or special-function (exp, rsqrt) results; fewer shared-memory round trips, no bank "
       "conflicts, more independent work between a load and its use"},
      {"barrier", "__syncthreads(); warps arrive unevenly, so balance work between warps or synchronise less"},
      {"mio_throttle",
       "a full shared-memory/special-instruction queue; use wider (16-byte) shared accesses and fewer of them"},
      {"lg_throttle", "a full global/local load-store queue; vectorise global accesses into fewer, wider ones"},
      {"math_pipe_throttle", "a saturated math pipe; the kernel is compute-bound on that pipe"},
      {"wait", "fixed-latency dependencies; interleave independent instructions (unroll, more ILP)"},
      {"not_selected", "nothing: eligible warps lost the issue slot to others, parallelism is sufficient"},
      {"membar", "memory fences; drop fences that are not needed or use narrower scopes"},
      {"branch_resolving", "branch targets; reduce divergent control flow"},
      {"dispatch_stall", "the dispatcher; usually a pipe conflict, rarely actionable"},
      {"drain", "stores draining at exit; nothing to gain unless the kernel is tiny"},
      {"no_instruction", "instruction fetch; the loop body may overflow the instruction cache (less unrolling)"},
      {"imc_miss", "the constant cache; a kernel-parameter or __constant__ access missed"},
      {"tex_throttle", "a full texture/L1TEX queue"},
      {"sleeping", "nanosleep or warp-level sleep"},
      {"misc", "miscellaneous hardware reasons"},
      {"gmma",
       "wgmma (GMMA) results; overlap more MMA with the next stage's loads (deeper pipeline, more "
       "consumer warpgroups)"},
  };
  auto it = hints.find(reason);
  return it == hints.end() ? "an unclassified reason" : it->second;
}

// Stalls that are the expected face of the bound (a memory-bound kernel waits on memory) say nothing new.
bool stall_explained_by(Bound b, const std::string& reason) {
  static const std::set<std::string> always = {"not_selected", "selected", "dispatch_stall"};
  static const std::set<std::string> memory = {"long_scoreboard", "lg_throttle", "drain", "tex_throttle"};
  static const std::set<std::string> compute = {"math_pipe_throttle", "wait", "gmma"};
  return always.count(reason) || (b == Bound::memory && memory.count(reason)) ||
         (b == Bound::compute && compute.count(reason));
}

}  // namespace

KernelAnalysis analyze_kernel(const KernelLaunch& k, const AnalysisOptions& o) {
  KernelAnalysis a;
  if (auto d = k.get("gpu__time_duration.sum")) a.duration_us = *d / 1e3;
  a.dram_pct = k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed");
  a.sm_pct = k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed");
  a.memory_pct = k.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed");
  a.dram_read_bytes = k.get("dram__bytes_read.sum");
  a.dram_write_bytes = k.get("dram__bytes_write.sum");
  a.achieved_occupancy_pct = k.get("sm__warps_active.avg.pct_of_peak_sustained_active");
  a.theoretical_occupancy_pct = k.get("sm__maximum_warps_per_active_cycle_pct");
  a.registers_per_thread = k.get("launch__registers_per_thread");
  a.block_size = k.get("launch__block_size");
  a.grid_size = k.get("launch__grid_size");
  a.waves = k.get("launch__waves_per_multiprocessor");
  const auto smem_static = k.get("launch__shared_mem_per_block_static");
  const auto smem_dynamic = k.get("launch__shared_mem_per_block_dynamic");
  if (smem_static || smem_dynamic) a.shared_bytes_per_block = smem_static.value_or(0) + smem_dynamic.value_or(0);
  a.sm_count = int(k.get("device__attribute_multiprocessor_count").value_or(o.fallback_sm_count));
  a.l1_hit_pct = k.get("l1tex__t_sector_hit_rate.pct");
  a.l2_hit_pct = k.get("lts__t_sector_hit_rate.pct");
  a.bank_conflicts_ld = k.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum");
  a.bank_conflicts_st = k.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum");
  a.shared_wavefronts_ld = k.get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum");
  a.shared_wavefronts_st = k.get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum");
  a.local_bytes_ld = k.get("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum");
  a.local_bytes_st = k.get("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum");
  a.spill_instructions = k.get("sass__inst_executed_register_spilling");
  a.hmma_instructions = k.get("sm__inst_executed_pipe_tensor_op_hmma.sum");
  a.gmma_instructions = k.get("sm__inst_executed_pipe_tensor_op_gmma.sum");
  a.tensor_pipe_pct = k.get("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active");

  // Occupancy limiter: the resource that allows the fewest blocks per SM (ties go to the first listed,
  // the one a kernel author most often controls).
  static const std::array<std::pair<const char*, const char*>, 5> kLimits = {{
      {"launch__occupancy_limit_registers", "registers"},
      {"launch__occupancy_limit_shared_mem", "shared memory"},
      {"launch__occupancy_limit_warps", "block size (warps per SM)"},
      {"launch__occupancy_limit_blocks", "blocks per SM"},
      {"launch__occupancy_limit_barriers", "barriers"},
  }};
  for (const auto& [metric, what] : kLimits) {
    auto v = k.get(metric);
    if (v && (!a.limiter_blocks || *v < *a.limiter_blocks)) {
      a.limiter_blocks = v;
      a.occupancy_limiter = what;
    }
  }

  // Stalls: every reason but "selected" (the cycle a warp issues is not a stall).
  double stall_total = 0;
  std::vector<Stall> stalls;
  for (const auto& r : kStallReasons) {
    if (auto v = k.get(stall_metric(r)); v && *v > 0) {
      stalls.push_back({r, *v, 0});
      stall_total += *v;
    }
  }
  std::stable_sort(stalls.begin(), stalls.end(),
                   [](const Stall& x, const Stall& y) { return x.cycles_per_issue > y.cycles_per_issue; });
  for (auto& s : stalls) s.share_pct = 100.0 * s.cycles_per_issue / stall_total;
  if (stalls.size() > 3) stalls.resize(3);
  a.top_stalls = stalls;

  // ---- classification ----
  const double dram = a.dram_pct.value_or(0), sm = a.sm_pct.value_or(0);
  const double mem = std::max(a.memory_pct.value_or(0), dram);
  const bool have_sol = a.dram_pct || a.sm_pct;
  const bool tiny = a.duration_us && *a.duration_us < kLaunchBoundUs;
  const bool dram_side = dram >= kBusyPct && dram >= sm;  // DRAM itself, not L1/L2/shared, is the busy unit
  if (!have_sol) {
    a.bound = Bound::unknown;
    a.bound_detail = "no DRAM or SM throughput in the capture";
  } else if (tiny && std::max(mem, sm) < kBusyPct) {
    a.bound = Bound::launch;
    a.bound_detail =
        num("%.1f us < ", *a.duration_us) + num("%.0f us", kLaunchBoundUs) + ", no unit above " + pct(kBusyPct);
  } else if (mem >= kBusyPct && mem >= sm) {
    a.bound = Bound::memory;
    a.bound_detail =
        (dram_side ? "DRAM " : "L1/L2/shared ") + pct(dram_side ? dram : mem) + " of peak >= SM " + pct(sm);
  } else if (sm >= kBusyPct) {
    a.bound = Bound::compute;
    a.bound_detail = "SM " + pct(sm) + " of peak > memory " + pct(mem);
  } else {
    a.bound = Bound::latency;
    a.bound_detail = "SM " + pct(sm) + " and memory " + pct(mem) + " of peak, both < " + pct(kBusyPct);
  }

  // ---- advice, each with a rough share of the time at stake ----
  auto add = [&](double score, std::string text) { a.advice.push_back({score, std::move(text)}); };
  const double blocks = a.grid_size.value_or(0);
  const int sms = a.sm_count;
  const std::string top_stall = a.top_stalls.empty() ? "" : a.top_stalls.front().reason;

  if (a.bound == Bound::launch) {
    std::string fill = blocks > 0 && blocks < sms ? num(" on %.0f blocks", blocks) + num(" (%.0f", blocks) + " of " +
                                                        std::to_string(sms) + " SMs have work)"
                                                  : "";
    add(95, "Launch-bound: " + num("%.1f us", *a.duration_us) + fill +
                ", with no unit busy; fixed launch and ramp-up costs dominate. Fuse it into a neighbouring "
                "kernel or give each launch more work; tuning inside the kernel cannot pay off at this size.");
  }

  if (a.bound == Bound::memory && dram_side) {
    if (dram < kNearRooflinePct)
      add(100 - dram, "Memory-bound at " + pct(dram) + " of peak DRAM bandwidth, " + pct(100 - dram) +
                          " left: keep more bytes in flight per SM (16-byte loads, several independent loads "
                          "per thread before the first use, more resident warps).");
    else
      add(10, "Memory-bound at " + pct(dram) +
                  " of peak DRAM bandwidth, near the roofline: only moving fewer bytes helps (fuse with the "
                  "neighbouring op, narrower dtypes).");
  } else if (a.bound == Bound::memory) {
    add(50, "Bound by on-chip memory (" + pct(mem) + " of peak in L1/L2/shared) while DRAM runs at " + pct(dram) +
                ": data is re-read from caches; keep reused values in registers and make shared accesses wider "
                "and conflict-free.");
  }

  if (o.ideal_bytes > 0 && a.dram_read_bytes && a.dram_write_bytes) {
    const double moved = *a.dram_read_bytes + *a.dram_write_bytes;
    const double ratio = moved / double(o.ideal_bytes);
    if (ratio > 1.15 && a.bound != Bound::launch) {
      std::string l2 = a.l2_hit_pct ? " (L2 hit rate " + pct(*a.l2_hit_pct) + ")" : "";
      add(std::min(90.0, (ratio - 1) * 50),
          "DRAM traffic " + bytes_str(moved) + " is " + num("%.2fx", ratio) + " the ideal " +
              bytes_str(double(o.ideal_bytes)) + " (every input read once, every output written once)" + l2 +
              ": data is fetched more than once; order the work so re-reads hit L2, or keep re-read data "
              "on chip.");
    }
  }

  const double hmma = a.hmma_instructions.value_or(0), gmma = a.gmma_instructions.value_or(0);
  const bool tensor_counted = a.hmma_instructions || a.gmma_instructions;
  const bool hopper = k.cc.rfind("9.", 0) == 0;
  if (o.matrix_op && tensor_counted && hmma + gmma == 0) {
    add(a.bound == Bound::compute ? 90 : 60,
        "No tensor-core instructions (HMMA = GMMA = 0) in a matrix kernel: the products run on the FMA pipes " +
            std::string(a.bound == Bound::compute ? "(SM at " + pct(sm) + ")" : "") +
            "; move them to mma.sync (HMMA) or, on Hopper, wgmma (GMMA).");
  } else if (o.matrix_op && hopper && hmma > 0 && gmma == 0 && a.bound != Bound::memory) {
    // (A memory-bound kernel, e.g. decode attention, gains nothing from a faster tensor pipe.)
    add(a.bound == Bound::compute ? 45 : 20,
        "Tensor cores run through HMMA (mma.sync, " + count_str(hmma) +
            " instructions) but no GMMA: Hopper's full tensor rate needs wgmma with operands in shared memory "
            "(loaded by TMA), which also frees the registers that mma.sync operands hold.");
  } else if (o.matrix_op && gmma > 0 && a.tensor_pipe_pct && *a.tensor_pipe_pct < kBusyPct &&
             a.bound != Bound::memory) {
    add(30, "GMMA in use but the tensor pipe is active " + pct(*a.tensor_pipe_pct) +
                " of cycles: keep it fed (deeper TMA pipeline, larger tiles, producer/consumer warpgroups).");
  }

  if (a.bound == Bound::compute && !(o.matrix_op && hmma + gmma == 0 && tensor_counted)) {
    add(std::max(5.0, sm - 50), "Compute-bound at " + pct(sm) +
                                    " of SM throughput: cut instructions per element (packed bf16x2 math, fewer "
                                    "index computations, no per-element division)" +
                                    (top_stall.empty() ? "" : "; top stall: " + top_stall) + ".");
  }

  if (a.bound == Bound::latency) {
    std::string why = a.top_stalls.empty() ? "no stall breakdown in the capture"
                                           : "warps wait mostly on " + stall_hint(top_stall) + " (" + top_stall + ", " +
                                                 pct(a.top_stalls.front().share_pct) + " of stall cycles)";
    add(70 - std::max(mem, sm) / 2,
        "Latency-bound: SM at " + pct(sm) + " and memory at " + pct(mem) + " of peak, neither busy; " + why + ".");
  } else if (a.bound != Bound::launch && !a.top_stalls.empty() && a.top_stalls.front().share_pct >= 40 &&
             !stall_explained_by(a.bound, top_stall)) {
    add(a.top_stalls.front().share_pct / 4, "Top stall " + top_stall + " (" + pct(a.top_stalls.front().share_pct) +
                                                " of stall cycles): waiting on " + stall_hint(top_stall) + ".");
  }

  // Occupancy: matters when latency, not a saturated unit, limits the kernel.
  const bool latency_sensitive =
      a.bound == Bound::latency || (a.bound == Bound::memory && dram_side && dram < kNearRooflinePct);
  if (a.theoretical_occupancy_pct && *a.theoretical_occupancy_pct < 50 && !a.occupancy_limiter.empty() &&
      a.bound != Bound::launch) {
    std::string detail;
    const std::string per_sm = a.limiter_blocks ? num("%.0f block(s) per SM", *a.limiter_blocks) : "few blocks per SM";
    if (a.occupancy_limiter == "registers" && a.registers_per_thread)
      detail = num("%.0f registers/thread allow ", *a.registers_per_thread) + per_sm +
               "; cap them with __launch_bounds__(threads, min_blocks) or keep less state per thread";
    else if (a.occupancy_limiter == "shared memory" && a.shared_bytes_per_block)
      detail = bytes_str(*a.shared_bytes_per_block) + " of shared memory per block allows " + per_sm +
               "; use fewer pipeline stages or smaller tiles";
    else if (a.occupancy_limiter == "blocks per SM" && a.block_size)
      detail = num("%.0f-thread", *a.block_size) + " blocks reach the blocks-per-SM limit; use larger blocks";
    else
      detail = a.occupancy_limiter + " allow " + per_sm;
    add(latency_sensitive ? 50 : 15,
        "Theoretical occupancy " + pct(*a.theoretical_occupancy_pct) +
            (a.achieved_occupancy_pct ? " (achieved " + pct(*a.achieved_occupancy_pct) + ")" : "") + ", limited by " +
            a.occupancy_limiter + ": " + detail + ".");
  } else if (a.theoretical_occupancy_pct && a.achieved_occupancy_pct &&
             *a.achieved_occupancy_pct < 0.7 * *a.theoretical_occupancy_pct && a.bound != Bound::launch &&
             blocks >= sms) {
    add(latency_sensitive ? 25 : 10,
        "Achieved occupancy " + pct(*a.achieved_occupancy_pct) + " of a theoretical " +
            pct(*a.theoretical_occupancy_pct) + ": warps finish unevenly or the last wave is partial" +
            (a.waves ? num(" (%.2f waves)", *a.waves) : "") + "; balance the work per block.");
  }

  if (blocks > 0 && blocks < sms && a.bound != Bound::launch) {
    add(60 * (1 - blocks / sms), num("Grid of %.0f blocks", blocks) + " leaves " + num("%.0f", sms - blocks) + " of " +
                                     std::to_string(sms) +
                                     " SMs idle: split the work further (more, smaller tiles; split-K or "
                                     "split the sequence).");
  } else if (a.waves && *a.waves > 1 && *a.waves < 3 && a.bound != Bound::launch) {
    const double frac = *a.waves - std::floor(*a.waves);
    if (frac > 0 && frac <= 0.5)
      add(100 * (1 - frac) / (2 * std::ceil(*a.waves)),
          num("%.2f waves", *a.waves) + ": the last wave runs " + pct(100 * frac) +
              " full; a block count that fills whole waves removes the tail.");
  }

  auto conflict_share = [](std::optional<double> c, std::optional<double> w) -> std::optional<double> {
    if (!c || !w || *w <= 0) return std::nullopt;
    return 100.0 * *c / *w;
  };
  const auto ld_share = conflict_share(a.bank_conflicts_ld, a.shared_wavefronts_ld);
  const auto st_share = conflict_share(a.bank_conflicts_st, a.shared_wavefronts_st);
  const double worst_share = std::max(ld_share.value_or(0), st_share.value_or(0));
  if (worst_share > 10) {
    const bool shared_stall = top_stall == "short_scoreboard" || top_stall == "mio_throttle";
    std::string parts;
    if (ld_share && *ld_share > 0)
      parts += "loads " + count_str(*a.bank_conflicts_ld) + " of " + count_str(*a.shared_wavefronts_ld) +
               " wavefronts (" + pct(*ld_share) + ")";
    if (st_share && *st_share > 0)
      parts += std::string(parts.empty() ? "" : ", ") + "stores " + count_str(*a.bank_conflicts_st) + " of " +
               count_str(*a.shared_wavefronts_st) + " (" + pct(*st_share) + ")";
    add(std::min(60.0, worst_share / (shared_stall ? 1.5 : 3)),
        "Shared-memory bank conflicts, " + parts +
            ": pad each row by one 4-byte word or swizzle the tile (XOR the column with the row).");
  }

  const double local = a.local_bytes_ld.value_or(0) + a.local_bytes_st.value_or(0);
  if (local > 0 || a.spill_instructions.value_or(0) > 0) {
    std::string regs = a.registers_per_thread ? num(" at %.0f registers/thread", *a.registers_per_thread) : "";
    std::string spills = a.spill_instructions ? ", " + count_str(*a.spill_instructions) + " spill instructions" : "";
    add(a.bound == Bound::latency ? 55 : 35,
        "Local memory traffic " + bytes_str(a.local_bytes_ld.value_or(0)) + " loaded, " +
            bytes_str(a.local_bytes_st.value_or(0)) + " stored" + spills + regs +
            ": registers spill or an array is indexed at run time; allow more registers, keep less live state, "
            "or make array indices compile-time constants.");
  }

  std::stable_sort(a.advice.begin(), a.advice.end(),
                   [](const Advice& x, const Advice& y) { return x.score > y.score; });
  return a;
}

// ---- 4. runner ----

namespace {

bool executable_file(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

std::string tail(const std::string& s, size_t lines) {
  size_t pos = s.size(), seen = 0;
  while (pos > 0 && seen <= lines) {
    pos = s.rfind('\n', pos - 1);
    if (pos == std::string::npos) return s;
    ++seen;
  }
  return s.substr(pos + 1);
}

// Runs `command` through /bin/sh, returns its stdout+stderr and exit status.
std::pair<std::string, int> run_shell(const std::string& command) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  KBN_CHECK(p != nullptr, "kb_nano profile: cannot start '", command, "'");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return {out, code};
}

}  // namespace

std::string locate_ncu(const std::string& explicit_path, const std::string& path_env) {
  if (!explicit_path.empty()) {
    KBN_CHECK(executable_file(explicit_path), "--ncu: '", explicit_path,
              "' is not an executable file; pass the path of Nsight Compute's ncu (e.g. /usr/local/cuda/bin/ncu)");
    return explicit_path;
  }
  std::vector<std::string> searched;
  std::stringstream ss(path_env);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    searched.push_back(dir);
    if (executable_file(dir + "/ncu")) return dir + "/ncu";
  }
  const std::string cuda_bin = "/usr/local/cuda/bin";
  searched.push_back(cuda_bin);
  if (executable_file(cuda_bin + "/ncu")) return cuda_bin + "/ncu";
  // Standalone Nsight Compute installs: /opt/nvidia/nsight-compute/<version>/ncu, newest version first.
  std::vector<std::string> versions;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/opt/nvidia/nsight-compute", ec))
    versions.push_back(e.path().string());
  std::sort(versions.rbegin(), versions.rend());
  searched.push_back("/opt/nvidia/nsight-compute/*");
  for (const auto& v : versions)
    if (executable_file(v + "/ncu")) return v + "/ncu";
  std::string where;
  std::set<std::string> listed;
  for (const auto& s : searched)
    if (listed.insert(s).second) where += (where.empty() ? "" : ":") + s;
  KBN_FAIL("Nsight Compute's ncu was not found. Searched PATH and the usual install folders: ", where,
           ". Install Nsight Compute (it ships with the CUDA toolkit) or pass --ncu /path/to/ncu.");
}

std::vector<std::string> ncu_argv(const NcuInvocation& inv) {
  std::string metrics;
  for (const auto& m : inv.metrics) metrics += (metrics.empty() ? "" : ",") + m;
  std::vector<std::string> argv = {inv.ncu};
  auto flag = [&](const char* name, std::string value) {
    argv.push_back(name);
    argv.push_back(std::move(value));
  };
  flag("--target-processes", "all");
  flag("--clock-control", "none");
  flag("--cache-control", "all");
  flag("--kernel-name-base", "demangled");
  flag("--kernel-name", "regex:" + inv.kernel_regex);
  flag("--launch-skip", std::to_string(inv.launch_skip));
  flag("--launch-count", std::to_string(inv.launch_count));
  argv.push_back("--csv");
  flag("--page", "raw");
  flag("--print-units", "base");
  flag("--print-kernel-base", "demangled");
  flag("--metrics", metrics);
  if (!inv.log_file.empty()) flag("--log-file", inv.log_file);
  argv.insert(argv.end(), inv.workload.begin(), inv.workload.end());
  return argv;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += (out.empty() ? "" : " ") + q + "'";
  }
  return out;
}

std::vector<std::string> unknown_metrics(const std::string& output, const std::vector<std::string>& requested) {
  std::vector<std::string> out;
  std::istringstream in(output);
  std::string line;
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (std::getline(in, line)) {
    if (line.find("Failed to find metric") == std::string::npos) continue;
    for (const auto& m : requested) {
      const std::string base = m.substr(0, m.find('.'));
      for (size_t at = line.find(base); at != std::string::npos; at = line.find(base, at + 1)) {
        const bool starts = at == 0 || !word_char(line[at - 1]);
        const bool ends = at + base.size() == line.size() || !word_char(line[at + base.size()]);
        if (starts && ends) {
          if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
          break;
        }
      }
    }
  }
  return out;
}

std::string diagnose_ncu_output(const std::string& output, const std::string& kernel_regex) {
  if (output.find("ERR_NVGPUCTRPERM") != std::string::npos ||
      output.find("permission to access NVIDIA GPU Performance Counters") != std::string::npos)
    return "ncu cannot read the GPU's performance counters (ERR_NVGPUCTRPERM): the driver restricts them to "
           "administrators. Run kb_nano profile as root, or have an administrator set the nvidia module option "
           "NVreg_RestrictProfilingToAdminUsers=0 (a line `options nvidia NVreg_RestrictProfilingToAdminUsers=0` "
           "in /etc/modprobe.d/, then reload the driver or reboot); in a container the host must allow it.";
  if (output.find("Failed to find metric") != std::string::npos) {
    std::string lines;
    std::istringstream in(output);
    std::string line;
    while (std::getline(in, line))
      if (line.find("Failed to find metric") != std::string::npos) lines += "\n  " + trim(line);
    return "ncu does not know a requested metric on this GPU/version:" + lines +
           "\nCheck the name with `ncu --query-metrics` and correct profile_metrics() in bench/profile.cpp.";
  }
  if (output.find("No kernels were profiled") != std::string::npos) {
    std::string available;
    const size_t at = output.find("Available Kernels:");
    if (at != std::string::npos) {
      std::istringstream in(output.substr(at));
      std::string line;
      std::getline(in, line);
      for (int i = 0; i < 12 && std::getline(in, line) && !line.empty() && line.rfind("==", 0) != 0; ++i)
        available += "\n  " + trim(line);
    }
    return "ncu profiled no kernel: none matched --kernel-name regex:" + kernel_regex +
           " after the skipped launches. Either the op's kernels live outside that namespace (the baseline "
           "linear calls cuBLASLt: pass --kernel-regex), or the case was not timed (it failed validation; "
           "see the program's output), or --launch-skip exceeds the launches made." +
           (available.empty() ? "" : "\nKernels the program launched:" + available);
  }
  if (output.find("Profiling is not supported on this device") != std::string::npos ||
      output.find("device is not supported") != std::string::npos)
    return "ncu does not support profiling this GPU with this driver/ncu version; use the ncu shipped with the "
           "installed CUDA toolkit (--ncu /usr/local/cuda/bin/ncu).";
  return "";
}

NcuResult run_ncu(NcuInvocation inv) {
  namespace fs = std::filesystem;
  NcuResult result;
  std::string tmp_dir;
  if (inv.log_file.empty()) {
    std::string templ = (fs::temp_directory_path() / "kbn_profile_XXXXXX").string();
    KBN_CHECK(::mkdtemp(templ.data()) != nullptr, "kb_nano profile: cannot create a temporary folder under ",
              fs::temp_directory_path().string());
    tmp_dir = templ;
    inv.log_file = tmp_dir + "/ncu.csv";
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } cleanup{tmp_dir};

  constexpr int kMaxRetries = 8;
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    fs::remove(inv.log_file, ec);
    result.command = shell_join(ncu_argv(inv));
    auto [program_output, code] = run_shell(result.command);
    std::string tool_output;
    if (std::ifstream log(inv.log_file); log) {
      std::stringstream ss;
      ss << log.rdbuf();
      tool_output = ss.str();
    }
    const std::string all = tool_output + "\n" + program_output;
    const std::vector<std::string> unknown = unknown_metrics(all, inv.metrics);
    if (!unknown.empty() && attempt < kMaxRetries) {
      for (const auto& m : unknown) {
        inv.metrics.erase(std::remove(inv.metrics.begin(), inv.metrics.end(), m), inv.metrics.end());
        result.dropped_metrics.push_back(m);
      }
      std::fprintf(stderr, "kb_nano profile: this ncu has no metric %s; retrying without it\n",
                   unknown.front().c_str());
      continue;
    }
    const std::string diagnosis = diagnose_ncu_output(all, inv.kernel_regex);
    KBN_CHECK(diagnosis.empty(), diagnosis, "\n  command: ", result.command, "\n  last output:\n", tail(all, 15));
    KBN_CHECK(code == 0, "ncu or the profiled program failed (exit status ", code, ")\n  command: ", result.command,
              "\n  last output:\n", tail(all, 25));
    // With --log-file the CSV is in the log; an ncu that ignores it prints the CSV among the program's output.
    result.csv = tool_output.find("\"ID\",") != std::string::npos ? tool_output : program_output;
    KBN_CHECK(result.csv.find("\"ID\",") != std::string::npos, "ncu wrote no CSV\n  command: ", result.command,
              "\n  last output:\n", tail(all, 25));
    result.launches = parse_ncu_csv(result.csv);
    KBN_CHECK(!result.launches.empty(), "ncu's CSV holds no kernel rows\n  command: ", result.command);
    return result;
  }
}

std::string ncu_version(const std::string& ncu) {
  auto [out, code] = run_shell(shell_join({ncu, "--version"}));
  std::string last;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!trim(line).empty()) last = trim(line);
  return code == 0 ? last : "";
}

int calls_before_timing(int64_t input_bytes, bool candidate, int validation_seeds) {
  const ValidationOptions v;
  const int distributions = input_bytes <= v.max_distribution_bytes ? int(bench::distributions().size()) : 1;
  const int runs = distributions + (validation_seeds - 1);
  const int per_run = candidate ? 1 : 2;
  const int first_run_extra = candidate ? 2 : 3;  // fresh values in the same buffers (both), determinism (cand)
  return runs * per_run + first_run_extra + TimingOptions{}.warmup_calls;
}

}  // namespace kbn::bench
