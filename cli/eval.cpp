// kb_nano eval: end-to-end serving numbers of the continuous-batching engine on a canonical seeded workload,
// baseline and candidate side by side on the same weights, with the greedy alignment of their outputs.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/ceilings.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/alignment.h"
#include "engine/kernel_trace.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/serial_floor.h"
#include "engine/tp_group.h"
#include "engine/workloads.h"
#include "kbn/allocator.h"
#include "kbn/device.h"
#include "kbn/format.h"
#include "kbn/model_view.h"
#include "kbn/version.h"
#include "kbn/weight_loading.h"
#include "cli/eval_url.h"
#include "text/tokenizer.h"

namespace kbn::cli {
namespace {

// On CPU (the reference oracle, no GPU) the canonical sizes take hours even on the tiny model: unless told
// otherwise, run this many requests at this fraction of the canonical lengths.
constexpr int64_t kCpuDefaultRequests = 32;
constexpr double kCpuDefaultScale = 0.25;

struct Options {
  std::string model;
  std::string device;
  std::string dtype;
  std::string weights;
  std::string workload = "balanced";
  std::string mode = "eager";
  std::string variant;  // empty = both when a candidate is built, else baseline
  int64_t num_requests = 0;
  double scale = 0;
  // vLLM's throughput flags (a "random" workload) or a JSONL dataset, instead of a named workload.
  int64_t input_len = 0, output_len = 0, num_prompts = 0;
  double range_ratio = 0;
  std::string dataset;
  uint64_t seed = 0;
  int64_t max_num_batched_tokens = 0;  // 0 = batch_defaults()
  int64_t max_num_seqs = 0;            // 0 = the workload's concurrency, else batch_defaults()
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;
  int64_t max_model_len = 0;
  double gpu_memory_utilization = 0.9;
  int tp = 1;
  bool step_profile = false;
  bool kernel_trace = false;
  bool no_prefix_caching = false;
  bool check_finite = false;
  bool pdl = false;     // programmatic dependent launch forced on (kbn/pdl.cuh; the default where the GPU has it)
  bool no_pdl = false;  // ... and off
  std::string admission = "reserve";  // reserve | optimistic
  std::string kv_cache_dtype = "auto";  // auto | fp8 | fp8_e4m3
  bool compare_kv_cache_dtype = false;  // run the baseline with auto KV, then with kv_cache_dtype, and align them
  NanoBatchFlags nano;                  // overlapped nano-batches (count 1: off)
  bool compare_nano_batches = false;    // run the baseline whole, then with --nano-batches, and align them
  bool async_scheduling = false;        // the engine's async scheduling (EngineConfig::async_scheduling)
  bool compare_async_scheduling = false;  // run the baseline synchronously, then with async scheduling, and align them
  int64_t divergence_samples = 64;
  std::string json;
  std::string csv;
  // --url: measure a running server instead of an engine here.
  std::string tokenizer;  // for a --dataset's text prompts (default: the model's)
  std::string url;
  std::string request_rate = "inf";
  int64_t max_concurrency = 0;
};

struct VariantRun {
  std::string name;            // the variant's name, or with --compare-kv-cache-dtype "baseline+kv-fp8e4m3"
  std::string kv_cache_dtype;  // the engine's --kv-cache-dtype for this run
  int nano_batches = 1;        // the engine's nano-batches per eager step for this run
  bool async_scheduling = false;  // the engine scheduled each step while the one before ran
  int64_t nano_steps = 0;      // steps of the measured run that ran as overlapped nano-batches
  engine::RunResult result;
  engine::ServingMetrics metrics;
  engine::KVCacheSizing sizing;
  // Graph mode: what was captured at start-up, and how many of the measured run's steps replayed a graph.
  std::vector<int64_t> graph_sizes;
  double graph_capture_s = 0;
  int64_t graph_capture_bytes = 0;
  int64_t graph_steps = 0;
  // On a GPU: allocations of the measured run that found the device full and returned the cached blocks first.
  int64_t cache_flushes = 0;
  bool traced = false;
  engine::KernelTrace trace;  // --kernel-trace: every kernel of the measured run
  // On a GPU: the serial floor of the steps the run executed.
  std::optional<engine::SerialFloor> floor;
};

// The serial floor's rates (engine/serial_floor.h), measured at start-up on the run's GPU, or why there are none.
struct FloorSetup {
  std::optional<engine::FloorRates> rates;
  std::string unavailable;  // why there is no floor (CPU run, f32 weights)
};

// What the floor is, in one line for the output and the JSON.
constexpr const char* kFloorDefinition =
    "sum over the run's steps of max(weight bytes / copy rate, GEMM FLOPs / bf16 GEMM rate) + KV bytes read / copy "
    "rate + attention FLOPs / bf16 GEMM rate; MoE expert weights: the expected experts touched under uniform "
    "routing, E(1 - (1 - k/E)^T) for the T tokens of a step";

// The exact command as the shell passed it.
std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), out;
  std::stringstream ss(all);
  std::string arg;
  while (std::getline(ss, arg, '\0')) {
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"$\\*?;&|<>()") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? arg : "'" + arg + "'");
  }
  return out;
}

std::string device_name(Device d) {
  if (d.is_cuda()) return bench::query_device(d.index).name;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "cpu";
}

nlohmann::json dist_json(const engine::Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}};
}

nlohmann::json kind_json(const engine::StepKindTotals& k) {
  return {{"steps", k.steps},         {"tokens", k.tokens},         {"prefill_tokens", k.prefill_tokens},
          {"wall_s", k.wall_s},       {"schedule_s", k.schedule_s}, {"prepare_s", k.prepare_s},
          {"forward_s", k.forward_s}, {"logits_s", k.logits_s},     {"sample_and_wait_s", k.sample_s},
          {"update_s", k.update_s}};
}

nlohmann::json step_profile_json(const engine::StepProfile& p) {
  return {{"decode_graph", kind_json(p.decode_graph)},
          {"decode_eager", kind_json(p.decode_eager)},
          {"with_prefill", kind_json(p.prefill)},
          {"all", kind_json(p.total())}};
}

// Where the run's time went, one line per kind of step (--step-profile).
// Rows of a right-aligned table after a left-aligned first column.
void print_cells(const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& c : cells)
    for (size_t i = 0; i < c.size(); ++i) width[i] = std::max(width[i], c[i].size());
  for (const auto& c : cells) {
    std::string out = "  ";
    for (size_t i = 0; i < c.size(); ++i)
      out += i == 0 ? c[i] + std::string(width[i] - c[i].size() + 2, ' ')
                    : std::string(width[i] - c[i].size(), ' ') + c[i] + (i + 1 < c.size() ? "  " : "");
    std::printf("%s\n", out.c_str());
  }
}

void print_step_profile(const VariantRun& r, Device device) {
  const engine::StepProfile& p = r.result.profile;
  std::printf("\nwhere the time went [%s] (seconds summed over steps; forward and logits are %s):\n",
              r.name.c_str(), device.is_cuda() ? "device spans by CUDA events" : "wall time");
  std::vector<std::vector<std::string>> cells = {{"steps", "count", "tokens", "prefill tokens", "wall", "schedule",
                                                  "prepare", "forward", "logits", "sample+wait", "update",
                                                  "forward tok/s"}};
  auto line = [&](const char* name, const engine::StepKindTotals& k) {
    if (k.steps == 0) return;
    cells.push_back({name, std::to_string(k.steps), std::to_string(k.tokens), std::to_string(k.prefill_tokens),
                     fmt("%.3f", k.wall_s), fmt("%.3f", k.schedule_s), fmt("%.3f", k.prepare_s),
                     fmt("%.3f", k.forward_s), fmt("%.3f", k.logits_s), fmt("%.3f", k.sample_s),
                     fmt("%.3f", k.update_s), k.forward_s > 0 ? fmt("%.0f", double(k.tokens) / k.forward_s) : "-"});
  };
  line("decode (graph)", p.decode_graph);
  line("decode (eager)", p.decode_eager);
  line("with prefill", p.prefill);
  line("all", p.total());
  print_cells(cells);
}

// The traced seconds of the ops named (their kernels' summed durations).
double trace_seconds(const engine::KernelTrace& t, const std::vector<std::string>& names) {
  double s = 0;
  for (const auto& k : t.by_op)
    for (const std::string& n : names)
      if (k.name == n) s += k.total_s;
  return s;
}

void print_kernel_trace(const VariantRun& r) {
  const engine::KernelTrace& t = r.trace;
  const bool floor = r.floor.has_value();
  std::string busy;
  for (const auto& [d, b] : t.busy_s)
    busy += fmt(" cuda:%g", double(d)) + fmt(" %.1f%%", t.wall_s > 0 ? 100.0 * b / t.wall_s : 0.0);
  const int64_t steps = r.metrics.steps;
  std::printf(
      "\nkernel time [%s] (CUPTI, %lld kernels, %.1f per step, %.3f s of kernels in %.3f s of wall time; busy:%s):\n",
      r.name.c_str(), (long long)t.kernels, steps > 0 ? double(t.kernels) / double(steps) : 0.0, t.kernel_s, t.wall_s,
      busy.c_str());
  double busy_total = 0;
  for (const auto& [d, b] : t.busy_s) busy_total += b;
  std::vector<std::vector<std::string>> ops = {
      {"op", "kernels", "seconds", "share", "mean us", "attributed s", "of busy", "attributed us"}};
  if (floor) ops[0].insert(ops[0].end(), {"serial floor s", "floor / seconds"});
  for (const auto& k : t.by_op) {
    ops.push_back({k.name, std::to_string(k.calls), fmt("%.3f", k.total_s),
                   fmt("%.1f%%", t.kernel_s > 0 ? 100.0 * k.total_s / t.kernel_s : 0.0),
                   fmt("%.1f", k.calls ? 1e6 * k.total_s / double(k.calls) : 0.0), fmt("%.3f", k.attributed_s),
                   fmt("%.1f%%", busy_total > 0 ? 100.0 * k.attributed_s / busy_total : 0.0),
                   fmt("%.1f", k.calls ? 1e6 * k.attributed_s / double(k.calls) : 0.0)});
    if (!floor) continue;
    // A floor share against the seconds of every op doing its work (linear's: rms_norm_gemv's folded projections
    // too), shown on the floor op's row; the other ops' rows name the share they are in.
    const double f = r.floor->op_floor_s(k.name);
    std::string within;
    for (const auto& o : r.floor->by_op)
      for (const std::string& name : engine::trace_ops_of_floor_op(o.op))
        if (name == k.name && name != o.op) within = "in " + o.op + "'s";
    const double measured = trace_seconds(t, engine::trace_ops_of_floor_op(k.name));
    ops.back().push_back(f > 0 ? fmt("%.3f", f) : within.empty() ? "-" : within);
    ops.back().push_back(f > 0 && measured > 0 ? fmt("%.1f%%", 100.0 * f / measured) : "-");
  }
  print_cells(ops);
  std::printf("  (attributed: the busy time during which the op's kernel was the oldest one running, so a kernel launched "
              "early under the one before it (dependent launch) is charged from that one's end: what the op costs the "
              "stream; seconds count the overlaps twice)\n");
  if (floor)
    std::printf("  (serial floor s: the op's share of the run's serial floor, its floor / seconds against every op doing "
                "that work (linear's: linear and rms_norm_gemv); '-': an op the floor does not count)\n");
  std::printf("  top kernels:\n");
  std::vector<std::vector<std::string>> top = {{"kernel", "op", "calls", "seconds", "share"}};
  for (size_t i = 0; i < t.by_kernel.size() && i < 12; ++i) {
    const auto& k = t.by_kernel[i];
    top.push_back({k.name.size() > 90 ? k.name.substr(0, 87) + "..." : k.name, k.op, std::to_string(k.calls),
                   fmt("%.3f", k.total_s), fmt("%.1f%%", t.kernel_s > 0 ? 100.0 * k.total_s / t.kernel_s : 0.0)});
  }
  print_cells(top);
}

nlohmann::json kernel_trace_json(const engine::KernelTrace& t) {
  auto stats = [](const std::vector<engine::KernelStat>& v, size_t limit) {
    nlohmann::json a = nlohmann::json::array();
    for (size_t i = 0; i < v.size() && i < limit; ++i)
      a.push_back({{"name", v[i].name},
                   {"op", v[i].op},
                   {"calls", v[i].calls},
                   {"seconds", v[i].total_s},
                   {"attributed_s", v[i].attributed_s}});
    return a;
  };
  nlohmann::json busy = nlohmann::json::object();
  for (const auto& [d, b] : t.busy_s) busy["cuda:" + std::to_string(d)] = b;
  return {{"wall_s", t.wall_s},       {"kernel_s", t.kernel_s},          {"kernels", t.kernels},
          {"busy_s", busy},           {"by_op", stats(t.by_op, SIZE_MAX)}, {"by_kernel", stats(t.by_kernel, 40)}};
}

nlohmann::json serial_floor_json(const VariantRun& r, const FloorSetup& setup) {
  if (!r.floor) return {{"available", false}, {"reason", setup.unavailable}};
  const engine::SerialFloor& f = *r.floor;
  nlohmann::json by_op = nlohmann::json::array();
  for (const auto& o : f.by_op) {
    nlohmann::json op = {{"op", o.op}, {"floor_s", o.floor_s}};
    if (r.traced) {
      const double measured = trace_seconds(r.trace, engine::trace_ops_of_floor_op(o.op));
      op["kernel_s"] = measured;
      op["kernel_ops"] = engine::trace_ops_of_floor_op(o.op);
      op["achieved_fraction"] = measured > 0 ? o.floor_s / measured : 0.0;
    }
    by_op.push_back(op);
  }
  return {{"available", true},
          {"definition", kFloorDefinition},
          {"floor_s", f.floor_s},
          {"achieved_fraction", f.achieved(r.metrics.duration_s)},
          {"overlap_floor_s", f.overlap_floor_s},
          {"overlap_achieved_fraction", f.overlap_achieved(r.metrics.duration_s)},
          {"gemm_s", f.gemm_s},
          {"kv_read_s", f.kv_read_s},
          {"attention_flops_s", f.attention_flops_s},
          {"steps", f.steps},
          {"compute_bound_steps", f.compute_bound_steps},
          {"weight_bytes", f.weight_bytes},
          {"gemm_flops", f.gemm_flops},
          {"kv_bytes", f.kv_bytes},
          {"attention_flops", f.attention_flops},
          {"copy_gb_per_s", f.rates.copy_bytes_per_s / 1e9},
          {"bf16_tflop_per_s", f.rates.gemm_flop_per_s / 1e12},
          {"by_op", by_op}};
}

nlohmann::json metrics_json(const VariantRun& r) {
  const engine::ServingMetrics& m = r.metrics;
  return {{"num_requests", m.num_requests},
          {"prompt_tokens", m.prompt_tokens},
          {"output_tokens", m.output_tokens},
          {"duration_s", m.duration_s},
          {"output_tokens_per_s", m.output_tokens_per_s},
          {"total_tokens_per_s", m.total_tokens_per_s},
          {"requests_per_s", m.requests_per_s},
          {"ttft_s", dist_json(m.ttft_s)},
          {"tpot_s", dist_json(m.tpot_s)},
          {"itl_s", dist_json(m.itl_s)},
          {"e2e_latency_s", dist_json(m.e2e_s)},
          {"steps", m.steps},
          {"preemptions", m.preemptions},
          {"prefix_cache_hit_tokens", m.cached_tokens},
          {"num_kv_blocks", r.sizing.num_blocks},
          {"kv_cache_sizing", r.sizing.explanation},
          {"num_state_slots", r.sizing.num_state_slots},
          {"allocator_cache_flushes", r.cache_flushes},
          {"kv_peak",
           {{"blocks", r.result.kv_peak.blocks},
            {"bytes", r.result.kv_peak.bytes},
            {"sequences", r.result.kv_peak.sequences},
            {"bytes_per_sequence",
             r.result.kv_peak.sequences ? r.result.kv_peak.bytes / r.result.kv_peak.sequences : 0},
            {"token_slots", r.result.kv_peak.tokens},
            {"bytes_without_window_release", r.result.kv_peak.full_bytes},
            {"definition",
             "KV blocks held by running sequences after the step where the engine held the most (one rank's cache), "
             "their bytes, and what the same table slots would cost if every layer kept a private page for every slot "
             "(no sliding-window release, no prefix sharing)"}}},
          {"cuda_graphs",
           {{"sizes", r.graph_sizes},
            {"capture_s", r.graph_capture_s},
            {"capture_bytes", r.graph_capture_bytes},
            {"graph_steps", r.graph_steps}}},
          {"async_scheduling", r.async_scheduling},
          {"nano_batches",
           {{"count", r.nano_batches},
            {"nano_batched_steps", r.nano_steps},
            {"definition",
             "a step run eagerly ran as min(count, its sequences) nano-batches when that gave each min_tokens "
             "tokens or more, each the whole model on a CUDA stream of its own (engine/nano_batch.h); "
             "nano_batched_steps of the measured run did"}}}};
}

// One CSV line per variant: the throughput and latency figures of --json (times in ms), the serial floor where
// there is one, and the build. Columns are fixed, so files of several runs concatenate under one header.
void write_csv(const std::string& path, const std::vector<VariantRun>& runs, const std::string& model,
               const std::string& workload, const std::string& mode, const FloorSetup& floor_setup) {
  std::ofstream out(path);
  KBN_CHECK(out.good(), "--csv: cannot write '", path, "'");
  std::vector<std::string> head = {"model", "workload", "mode", "variant", "num_requests", "prompt_tokens",
                                   "output_tokens", "duration_s", "output_tokens_per_s", "total_tokens_per_s",
                                   "requests_per_s"};
  for (const char* d : {"ttft", "tpot", "itl", "e2e"})
    for (const char* q : {"mean", "p50", "p90", "p99"}) head.push_back(std::string(d) + "_" + q + "_ms");
  head.insert(head.end(), {"steps", "preemptions", "prefix_cache_hit_tokens", "serial_floor_s", "floor_fraction",
                           "commit"});
  out << csv_line(head);
  auto num = [](double v) { return fmt("%.6g", v); };
  for (const auto& r : runs) {
    const engine::ServingMetrics& m = r.metrics;
    std::vector<std::string> f = {model, workload, mode, r.name, std::to_string(m.num_requests),
                                  std::to_string(m.prompt_tokens), std::to_string(m.output_tokens),
                                  num(m.duration_s), num(m.output_tokens_per_s), num(m.total_tokens_per_s),
                                  num(m.requests_per_s)};
    for (const engine::Distribution* d : {&m.ttft_s, &m.tpot_s, &m.itl_s, &m.e2e_s})
      for (double v : {d->mean, d->p50, d->p90, d->p99}) f.push_back(d->count ? num(1e3 * v) : "");
    f.insert(f.end(), {std::to_string(m.steps), std::to_string(m.preemptions), std::to_string(m.cached_tokens)});
    const nlohmann::json floor = serial_floor_json(r, floor_setup);
    const bool has_floor = floor.value("available", false);
    f.push_back(has_floor ? num(floor["floor_s"].get<double>()) : "");
    f.push_back(has_floor ? num(floor["achieved_fraction"].get<double>()) : "");
    f.push_back(build_info().git_commit);
    out << csv_line(f);
  }
}

std::string dist_ms(const engine::Distribution& d) {
  if (d.count == 0) return "-";
  return fmt("%.2f", 1e3 * d.mean) + " / " + fmt("%.2f", 1e3 * d.p50) + " / " + fmt("%.2f", 1e3 * d.p90) + " / " +
         fmt("%.2f", 1e3 * d.p99);
}

void print_table(const std::vector<VariantRun>& runs) {
  struct Row {
    std::string name;
    std::function<std::string(const engine::ServingMetrics&)> value;
    std::function<double(const engine::ServingMetrics&)> ratio;  // candidate / baseline of this number, if any
  };
  const std::vector<Row> rows = {
      {"output tokens/s", [](const auto& m) { return fmt("%.1f", m.output_tokens_per_s); },
       [](const auto& m) { return m.output_tokens_per_s; }},
      {"total tokens/s", [](const auto& m) { return fmt("%.1f", m.total_tokens_per_s); },
       [](const auto& m) { return m.total_tokens_per_s; }},
      {"requests/s", [](const auto& m) { return fmt("%.3f", m.requests_per_s); },
       [](const auto& m) { return m.requests_per_s; }},
      {"TTFT ms mean/p50/p90/p99", [](const auto& m) { return dist_ms(m.ttft_s); },
       [](const auto& m) { return m.ttft_s.mean; }},
      {"TPOT ms mean/p50/p90/p99", [](const auto& m) { return dist_ms(m.tpot_s); },
       [](const auto& m) { return m.tpot_s.mean; }},
      {"ITL ms mean/p50/p90/p99", [](const auto& m) { return dist_ms(m.itl_s); },
       [](const auto& m) { return m.itl_s.mean; }},
      {"E2E ms mean/p50/p90/p99", [](const auto& m) { return dist_ms(m.e2e_s); },
       [](const auto& m) { return m.e2e_s.mean; }},
      {"duration s", [](const auto& m) { return fmt("%.3f", m.duration_s); },
       [](const auto& m) { return m.duration_s; }},
      {"requests", [](const auto& m) { return std::to_string(m.num_requests); }, nullptr},
      {"prompt / output tokens",
       [](const auto& m) { return std::to_string(m.prompt_tokens) + " / " + std::to_string(m.output_tokens); },
       nullptr},
      {"steps", [](const auto& m) { return std::to_string(m.steps); }, nullptr},
      {"preemptions", [](const auto& m) { return std::to_string(m.preemptions); }, nullptr},
      {"prefix-cache hit tokens", [](const auto& m) { return std::to_string(m.cached_tokens); }, nullptr},
  };
  // Cells first, so that every column is as wide as its widest cell.
  std::vector<std::vector<std::string>> cells = {{""}};
  for (const auto& r : runs) cells[0].push_back(r.name);
  if (runs.size() == 2) cells[0].push_back(runs[1].name + "/" + runs[0].name);
  for (const Row& row : rows) {
    std::vector<std::string> line{row.name};
    for (const auto& r : runs) line.push_back(row.value(r.metrics));
    if (runs.size() == 2 && row.ratio) {
      const double b = row.ratio(runs[0].metrics), c = row.ratio(runs[1].metrics);
      line.push_back(b > 0 ? fmt("%.3fx", c / b) : "-");
    }
    cells.push_back(std::move(line));
  }
  if (!runs.front().graph_sizes.empty()) {
    std::vector<std::string> steps{"graph steps / steps"}, capture{"graph capture s"};
    for (const auto& r : runs) {
      steps.push_back(std::to_string(r.graph_steps) + " / " + std::to_string(r.metrics.steps));
      capture.push_back(fmt("%.2f", r.graph_capture_s));
    }
    cells.push_back(std::move(steps));
    cells.push_back(std::move(capture));
  }
  if (std::any_of(runs.begin(), runs.end(), [](const VariantRun& r) { return r.nano_batches > 1; })) {
    std::vector<std::string> line{"nano-batched steps / steps"};
    for (const auto& r : runs)
      line.push_back(r.nano_batches > 1 ? std::to_string(r.nano_steps) + " / " + std::to_string(r.metrics.steps) +
                                              " (" + std::to_string(r.nano_batches) + " each)"
                                        : "off");
    cells.push_back(std::move(line));
  }
  {
    // What the KV cache held at its fullest, per running request, and what the same requests' table slots would cost
    // with every layer keeping a private page for each (no sliding-window release, no prefix sharing).
    std::vector<std::string> line{"KV peak MiB / per request"}, full{"KV peak, every layer every slot"};
    bool windows = false;
    for (const auto& r : runs) {
      const engine::KvPeak& k = r.result.kv_peak;
      const double mib = double(k.bytes) / double(1 << 20);
      line.push_back(fmt("%.1f", mib) + " / " + fmt("%.2f", k.sequences ? mib / double(k.sequences) : 0.0));
      full.push_back(fmt("%.1f", double(k.full_bytes) / double(1 << 20)) +
                     (k.bytes > 0 ? " (" + fmt("%.2fx", double(k.full_bytes) / double(k.bytes)) + ")" : std::string()));
      windows = windows || k.full_bytes != k.bytes;
    }
    cells.push_back(std::move(line));
    if (windows) cells.push_back(std::move(full));
  }
  if (std::any_of(runs.begin(), runs.end(), [](const VariantRun& r) { return r.cache_flushes > 0; })) {
    std::vector<std::string> line{"allocator cache flushes"};  // the device ran full; cached blocks were returned
    for (const auto& r : runs) line.push_back(std::to_string(r.cache_flushes));
    cells.push_back(std::move(line));
  }
  {
    std::vector<std::string> floor{"serial floor s"}, achieved{"floor / duration"}, overlap{"overlap floor s"};
    for (const auto& r : runs) {
      floor.push_back(r.floor ? fmt("%.3f", r.floor->floor_s) : "n/a");
      achieved.push_back(r.floor ? fmt("%.1f%%", 100.0 * r.floor->achieved(r.metrics.duration_s)) : "n/a");
      overlap.push_back(r.floor ? fmt("%.3f", r.floor->overlap_floor_s) : "n/a");
    }
    if (runs.size() == 2 && runs[0].floor && runs[1].floor) {
      const double b = runs[0].floor->achieved(runs[0].metrics.duration_s);
      achieved.push_back(b > 0 ? fmt("%.3fx", runs[1].floor->achieved(runs[1].metrics.duration_s) / b) : "-");
    }
    cells.push_back(std::move(floor));
    cells.push_back(std::move(achieved));
    cells.push_back(std::move(overlap));
  }
  std::vector<size_t> width;
  for (const auto& line : cells)
    for (size_t c = 0; c < line.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], line[c].size());
    }
  for (const auto& line : cells) {
    std::string out;
    for (size_t c = 0; c < line.size(); ++c)
      out += c + 1 < line.size() ? line[c] + std::string(width[c] - line[c].size() + 3, ' ') : line[c];
    std::printf("%s\n", out.c_str());
  }
}

// The serial floor of each run and what it is made of (engine/serial_floor.h).
void print_serial_floor(const std::vector<VariantRun>& runs, const FloorSetup& setup) {
  if (!setup.rates) {
    std::printf("\nserial floor: n/a (%s)\n", setup.unavailable.c_str());
    return;
  }
  std::printf("\nserial floor (%s):\n", kFloorDefinition);
  std::printf("  rates measured at start-up on this GPU: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n",
              setup.rates->copy_bytes_per_s / 1e9, setup.rates->gemm_flop_per_s / 1e12);
  for (const auto& r : runs) {
    if (!r.floor) continue;
    const engine::SerialFloor& f = *r.floor;
    std::printf(
        "  [%s] %.3f s = GEMMs %.3f s (%.3g GB of weights, %.3g TFLOP; %lld of %lld steps FLOP-bound) + KV reads %.3f "
        "s (%.3g GB) + attention FLOPs %.3f s (%.3g TFLOP); measured %.3f s: %.1f%% of the floor's speed; "
        "overlapped floor (bytes and FLOPs of each step at once) %.3f s\n",
        r.name.c_str(), f.floor_s, f.gemm_s, f.weight_bytes / 1e9, f.gemm_flops / 1e12,
        (long long)f.compute_bound_steps, (long long)f.steps, f.kv_read_s, f.kv_bytes / 1e9, f.attention_flops_s,
        f.attention_flops / 1e12, r.metrics.duration_s, 100.0 * f.achieved(r.metrics.duration_s),
        f.overlap_floor_s);
  }
}

// Progress on stderr: rewritten in place on a terminal, one line every 10 s otherwise.
class Progress {
 public:
  explicit Progress(const char* label) : label_(label), tty_(isatty(2)) {}
  void operator()(const engine::EngineProgress& p) {
    const bool done = p.finished == p.total;
    if (!done && p.elapsed_s - last_ < (tty_ ? 0.5 : 10.0)) return;
    last_ = p.elapsed_s;
    std::fprintf(stderr, "%s[%s] %lld/%lld requests, %lld output tokens, %.1f tok/s, %lld steps, %.1f s%s",
                 tty_ ? "\r" : "", label_, (long long)p.finished, (long long)p.total, (long long)p.output_tokens,
                 p.elapsed_s > 0 ? double(p.output_tokens) / p.elapsed_s : 0.0, (long long)p.steps, p.elapsed_s,
                 tty_ && !done ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  const char* label_;
  bool tty_;
  double last_ = -1e9;
};

// All requests arrive at once (wave = 0), or in waves of `wave` requests, each arriving when the previous
// wave has finished (the latency workloads: vLLM's latency benchmark also times whole batches). The duration
// is the sum of the waves' durations.
engine::RunResult run_workload(engine::LLMEngine& eng, const std::vector<engine::Request>& requests, int64_t wave,
                               Progress& progress) {
  if (wave <= 0 || wave >= int64_t(requests.size())) return eng.run_to_completion(requests, std::ref(progress));
  engine::RunResult all;
  engine::EngineProgress before;
  before.total = int64_t(requests.size());
  double duration = 0;
  for (size_t first = 0; first < requests.size(); first += size_t(wave)) {
    const std::vector<engine::Request> part(requests.begin() + long(first),
                                            requests.begin() + long(std::min(requests.size(), first + size_t(wave))));
    engine::RunResult r = eng.run_to_completion(part, [&](const engine::EngineProgress& p) {
      engine::EngineProgress q = p;
      q.finished += before.finished;
      q.total = before.total;
      q.output_tokens += before.output_tokens;
      q.steps += before.steps;
      q.elapsed_s += before.elapsed_s;
      progress(q);
    });
    if (first == 0) all.start_time = r.start_time;
    duration += r.end_time - r.start_time;
    all.steps += r.steps;
    all.preemptions += r.preemptions;
    all.cached_tokens += r.cached_tokens;
    if (r.kv_peak.blocks > all.kv_peak.blocks) all.kv_peak = r.kv_peak;
    all.profile.add(r.profile);
    all.step_shapes.insert(all.step_shapes.end(), r.step_shapes.begin(), r.step_shapes.end());
    for (auto& out : r.outputs) {
      before.output_tokens += int64_t(out.tokens.size());
      all.outputs.push_back(std::move(out));
    }
    before.finished += int64_t(part.size());
    before.steps += r.steps;
    before.elapsed_s += r.end_time - r.start_time;
  }
  all.end_time = all.start_time + duration;
  return all;
}

// The batch limits vLLM's offline engine (the LLM class, which its throughput benchmark uses) picks for a
// device: 16384 tokens per step and 1024 running sequences on GPUs with >= 70 GiB that are not A100s (H100,
// H200), else 8192 and 256 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults). The published H200
// figures the issue compares against were measured with these, so eval uses them unless told otherwise.
struct BatchDefaults {
  int64_t max_num_batched_tokens = 8192, max_num_seqs = 256;
};
// The workload: a named one, vLLM's random one from its flags, or a dataset. Explicit lengths are never shrunk
// on the CPU (only the request count is, when not given).
struct BuiltWorkload {
  engine::Workload workload;
  engine::WorkloadOptions options;
  std::string shrunk;   // what a CPU run left out, for the output
  bool custom = false;  // vLLM's flags or a dataset rather than a named workload
};

BuiltWorkload build_workload(const Options& o, int64_t vocab_size, int64_t max_model_len, bool cpu,
                             const std::string& tokenizer_path) {
  BuiltWorkload b;
  const bool random_flags = o.input_len > 0 || o.output_len > 0 || o.range_ratio > 0;
  b.custom = random_flags || !o.dataset.empty();
  KBN_CHECK(o.num_prompts == 0 || o.num_requests == 0, "--num-prompts and --num-requests: give one (the same count)");
  const int64_t num_requests = o.num_prompts > 0 ? o.num_prompts : o.num_requests;
  // The generated workload's spec (a dataset's comes from its file).
  const engine::WorkloadSpec requested =
      random_flags    ? engine::random_workload_spec(o.input_len > 0 ? o.input_len : 1024,
                                                     o.output_len > 0 ? o.output_len : 128,
                                                     num_requests > 0 ? num_requests : 1000, o.range_ratio)
      : o.dataset.empty() ? engine::workload_spec(o.workload)
                          : engine::WorkloadSpec{};
  engine::WorkloadOptions& wo = b.options;
  wo.seed = o.seed;
  wo.vocab_size = vocab_size;
  wo.max_model_len = max_model_len;
  wo.num_requests = num_requests;
  wo.scale = o.scale > 0 ? o.scale : 1.0;
  if (cpu && num_requests == 0 && o.dataset.empty()) {
    wo.num_requests = std::min(kCpuDefaultRequests, requested.num_requests);
    b.shrunk += " " + std::to_string(wo.num_requests) + " requests (not " + std::to_string(requested.num_requests) + ")";
  }
  if (cpu && o.scale == 0 && !b.custom) {
    wo.scale = kCpuDefaultScale;
    b.shrunk += std::string(b.shrunk.empty() ? "" : ",") + " lengths x " + fmt("%g", kCpuDefaultScale);
  }
  if (!o.dataset.empty() && !tokenizer_path.empty()) {
    auto tok = std::make_shared<text::Tokenizer>(text::Tokenizer::from_file(tokenizer_path));
    wo.encode = [tok](const std::string& t) {
      const std::vector<int32_t> ids = tok->encode(t, true);
      return std::vector<int64_t>(ids.begin(), ids.end());
    };
  }
  b.workload = !o.dataset.empty() ? engine::load_dataset_workload(o.dataset, o.output_len > 0 ? o.output_len : 128, wo)
                                  : engine::make_workload(requested, wo);
  return b;
}

BatchDefaults batch_defaults(Device device) {
  BatchDefaults b;
  if (!device.is_cuda()) return b;
  const bench::DeviceInfo d = bench::query_device(device.index);
  std::string name = d.name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (d.memory_bytes >= (70ll << 30) && name.find("a100") == std::string::npos) {
    b.max_num_batched_tokens = 16384;
    b.max_num_seqs = 1024;
  }
  return b;
}

// eval --url: the workload sent to a running server (cli/eval_url.h). Flags that configure an engine here belong to
// the server and are refused, not ignored.
void run_url(const Options& o, bool max_num_seqs_given) {
  check_output_file("--json", o.json);
  check_output_file("--csv", o.csv);
  const std::vector<std::pair<bool, const char*>> engine_flags = {
      {!o.device.empty(), "--device"},         {!o.dtype.empty(), "--dtype"},
      {!o.weights.empty(), "--weights"},       {!o.variant.empty(), "--variant"},
      {o.tp != 1, "--tp"},                     {o.mode != "eager", "--mode"},
      {max_num_seqs_given, "--max-num-seqs"},  {o.max_num_batched_tokens > 0, "--max-num-batched-tokens"},
      {o.num_kv_blocks > 0, "--num-kv-blocks"}, {o.step_profile, "--step-profile"},
      {o.kernel_trace, "--kernel-trace"},      {o.check_finite, "--check-finite"},
      {o.pdl, "--pdl"},                        {o.no_pdl, "--no-pdl"},
      {o.nano.given(), "--nano-batches / --nano-batch-*"},      {o.compare_nano_batches, "--compare-nano-batches"},
      {o.async_scheduling, "--async-scheduling"},              {o.compare_async_scheduling, "--compare-async-scheduling"}};
  for (const auto& [given, flag] : engine_flags)
    KBN_CHECK(!given, flag, ": with --url the engine is the server's (set it on kb_nano serve)");
  double rate = 0;
  if (o.request_rate != "inf") {
    size_t used = 0;
    try {
      rate = std::stod(o.request_rate, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KBN_CHECK(used == o.request_rate.size() && rate > 0 && std::isfinite(rate),
              "--request-rate: expected requests per second > 0, or inf, got '", o.request_rate, "'");
  }
  KBN_CHECK(o.max_concurrency >= 0, "--max-concurrency: expected >= 1 (0 = no limit), got ", o.max_concurrency);
  const ServerInfo info = query_server(o.url);
  int64_t vocab = info.vocab_size, max_len = info.max_model_len;
  if (vocab == 0 || max_len == 0) {
    KBN_CHECK(!o.model.empty(), "--url: ", o.url, " does not say its model's vocab_size and max_model_len (not a "
              "kb-nano server?): give --model with the served model's config");
    const engine::ModelSpec spec = engine::resolve_model(o.model);
    vocab = spec.config.language_model().get_int("vocab_size");
    max_len = engine::max_positions(spec);
  }
  if (o.max_model_len > 0) max_len = std::min(max_len, o.max_model_len);
  std::string tok_path = o.tokenizer;
  if (tok_path.empty() && !o.model.empty()) tok_path = engine::resolve_model(o.model).tokenizer_path;
  const BuiltWorkload b = build_workload(o, vocab, max_len, false, tok_path);
  UrlRunOptions u;
  u.url = o.url;
  while (!u.url.empty() && u.url.back() == '/') u.url.pop_back();
  u.model = info.model;
  u.request_rate = rate;
  u.max_concurrency = o.max_concurrency;
  u.seed = o.seed;
  u.workload = b.workload.spec.name;
  u.json = o.json;
  u.csv = o.csv;
  u.command = command_line();
  std::printf("kb_nano eval --url %s: model '%s', %zu requests of workload %s\n", u.url.c_str(), u.model.c_str(),
              b.workload.requests.size(), u.workload.c_str());
  measure_server(u, b.workload.requests);
}

// The flags that take no model or device to check, refused before anything loads (a typo must not cost a whole
// run). Output paths first.
void check_run_flags(const Options& o, bool max_num_seqs_given) {
  check_output_file("--json", o.json);
  check_output_file("--csv", o.csv);
  KBN_CHECK(o.mode == "eager" || o.mode == "graph", "--mode: expected eager or graph, got '", o.mode, "'");
  KBN_CHECK(o.num_requests >= 0, "--num-requests: expected a count >= 1, got ", o.num_requests);
  KBN_CHECK(o.scale >= 0, "--scale: expected a factor > 0, got ", o.scale);
  KBN_CHECK(o.max_num_batched_tokens >= 0, "--max-num-batched-tokens: expected >= 1 (0 = the device's default), got ",
            o.max_num_batched_tokens);
  KBN_CHECK(!max_num_seqs_given || o.max_num_seqs >= 1, "--max-num-seqs: expected >= 1, got ", o.max_num_seqs);
  KBN_CHECK(o.block_size >= 1, "--block-size: expected >= 1, got ", o.block_size);
  KBN_CHECK(o.tp >= 1, "--tp: expected a tensor-parallel size >= 1, got ", o.tp);
  KBN_CHECK(o.num_kv_blocks >= 0, "--num-kv-blocks: expected >= 1 (0 = sized automatically), got ", o.num_kv_blocks);
  KBN_CHECK(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1,
            "--gpu-memory-utilization: expected a fraction in (0, 1], got ", o.gpu_memory_utilization);
  KBN_CHECK(o.divergence_samples >= 0, "--divergence-samples: expected a count >= 0, got ", o.divergence_samples);
  (void)o.nano.resolve(o.tp);
  KBN_CHECK(!o.compare_nano_batches || o.nano.count > 1,
            "--compare-nano-batches: compares --nano-batches N (N >= 2) with whole steps; give --nano-batches 2");
  KBN_CHECK(int(o.compare_nano_batches) + int(o.compare_kv_cache_dtype) + int(o.compare_async_scheduling) <= 1,
            "--compare-nano-batches, --compare-kv-cache-dtype and --compare-async-scheduling each run the baseline "
            "twice; give one of them");
  KBN_CHECK(!(o.async_scheduling && o.compare_async_scheduling),
            "--compare-async-scheduling runs the baseline without, then with async scheduling; drop --async-scheduling");
  const bool async = o.async_scheduling || o.compare_async_scheduling;
  const char* async_flag = o.async_scheduling ? "--async-scheduling" : "--compare-async-scheduling";
  KBN_CHECK(!async || o.tp == 1, async_flag, ": async scheduling needs --tp 1, got --tp ", o.tp);
  KBN_CHECK(!async || !o.step_profile, "--step-profile times every step alone; async scheduling overlaps each step with "
            "the next one's host work: drop one of them");
  KBN_CHECK(o.admission == "reserve" || o.admission == "optimistic",
            "--admission: expected reserve or optimistic, got '", o.admission, "'");
}

// One measured run: a variant with a KV cache dtype, under its name in the output.
struct Pass {
  Variant variant;
  std::string kv_cache_dtype, name;
  int nano_batches = 1;
  bool async_scheduling = false;
};

// The runs: each variant with --kv-cache-dtype, or (--compare-kv-cache-dtype) the baseline with the model's dtype in
// its pages, then with --kv-cache-dtype's, aligned like a candidate with its baseline.
std::vector<Pass> select_passes(const Options& o) {
  std::vector<Variant> variants;
  if (o.variant.empty()) {
    variants = candidate_built() ? std::vector<Variant>{Variant::baseline, Variant::candidate}
                                 : std::vector<Variant>{Variant::baseline};
  } else if (o.variant == "baseline") {
    variants = {Variant::baseline};
  } else if (o.variant == "candidate" || o.variant == "both") {
    KBN_CHECK(candidate_built(), "--variant ", o.variant,
              ": no candidate is compiled into this binary (tasks/candidate/ held no task files at build time)");
    variants = o.variant == "both" ? std::vector<Variant>{Variant::baseline, Variant::candidate}
                                   : std::vector<Variant>{Variant::candidate};
  } else {
    KBN_FAIL("--variant: expected baseline, candidate or both, got '", o.variant, "'");
  }
  std::vector<Pass> passes;
  if (o.compare_kv_cache_dtype) {
    const std::optional<DType> kv = parse_kv_cache_dtype(o.kv_cache_dtype, "--kv-cache-dtype");
    KBN_CHECK(kv.has_value(), "--compare-kv-cache-dtype: compares the pages of --kv-cache-dtype with the model's "
              "dtype; give --kv-cache-dtype fp8 (got auto)");
    KBN_CHECK(variants.size() == 1 && variants[0] == Variant::baseline, "--compare-kv-cache-dtype: runs the baseline "
              "twice (two KV dtypes); it does not combine with --variant ", o.variant.empty() ? "both" : o.variant,
              " (pass --variant baseline)");
    passes = {{Variant::baseline, "auto", "baseline", o.nano.count, o.async_scheduling},
              {Variant::baseline, o.kv_cache_dtype, std::string("baseline+kv-") + dtype_name(*kv), o.nano.count,
               o.async_scheduling}};
  } else if (o.compare_nano_batches) {
    KBN_CHECK(variants.size() == 1 && variants[0] == Variant::baseline, "--compare-nano-batches: runs the baseline "
              "twice (whole steps, then nano-batches); it does not combine with --variant ",
              o.variant.empty() ? "both" : o.variant, " (pass --variant baseline)");
    passes = {{Variant::baseline, o.kv_cache_dtype, "baseline", 1, o.async_scheduling},
              {Variant::baseline, o.kv_cache_dtype, "baseline+nano-" + std::to_string(o.nano.count),
               o.nano.count, o.async_scheduling}};
  } else if (o.compare_async_scheduling) {
    KBN_CHECK(variants.size() == 1 && variants[0] == Variant::baseline, "--compare-async-scheduling: runs the "
              "baseline twice (synchronous steps, then async scheduling); it does not combine with --variant ",
              o.variant.empty() ? "both" : o.variant, " (pass --variant baseline)");
    passes = {{Variant::baseline, o.kv_cache_dtype, "baseline", o.nano.count, false},
              {Variant::baseline, o.kv_cache_dtype, "baseline+async", o.nano.count, true}};
  } else {
    for (Variant v : variants)
      passes.push_back({v, o.kv_cache_dtype, variant_name(v), o.nano.count, o.async_scheduling});
  }
  return passes;
}

// The weights' dtype: --dtype, else the model's default on the device.
DType select_dtype(const Options& o, const engine::ModelSpec& spec, Device device) {
  if (o.dtype.empty()) return engine::default_dtype(spec, device);
  DType dtype = DType::u8;  // refused just below, with the flag's name
  try {
    dtype = parse_dtype(o.dtype);
  } catch (const Error&) {
  }
  KBN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
            "--dtype: expected f32, bf16 or f16, got '", o.dtype, "'");
  return dtype;
}

// The prompt and output lengths of a workload's requests.
struct WorkloadStats {
  int64_t prompt_tokens = 0, output_tokens = 0, in_min = INT64_MAX, in_max = 0, out_min = INT64_MAX, out_max = 0;
  double requests = 1;  // at least 1, for the means
};

WorkloadStats workload_stats(const engine::Workload& workload) {
  WorkloadStats w;
  for (const auto& r : workload.requests) {
    const int64_t in = int64_t(r.prompt.size()), out = r.sampling.max_tokens;
    w.prompt_tokens += in;
    w.output_tokens += out;
    w.in_min = std::min(w.in_min, in);
    w.in_max = std::max(w.in_max, in);
    w.out_min = std::min(w.out_min, out);
    w.out_max = std::max(w.out_max, out);
  }
  w.requests = double(std::max<size_t>(workload.requests.size(), 1));
  return w;
}

engine::EngineConfig engine_config(const Options& o, const engine::WorkloadSpec& wspec, Device device,
                                   int64_t max_model_len, bool max_num_seqs_given) {
  engine::EngineConfig ecfg;
  ecfg.block_size = o.block_size;
  ecfg.num_kv_blocks = o.num_kv_blocks;
  const BatchDefaults batch = batch_defaults(device);
  ecfg.max_num_batched_tokens = o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens : batch.max_num_batched_tokens;
  ecfg.max_num_seqs =
      max_num_seqs_given ? o.max_num_seqs : (wspec.max_num_seqs > 0 ? wspec.max_num_seqs : batch.max_num_seqs);
  ecfg.max_model_len = max_model_len;
  ecfg.gpu_memory_utilization = o.gpu_memory_utilization;
  ecfg.mode = engine::parse_execution_mode(o.mode);
  ecfg.profile_steps = o.step_profile;
  ecfg.check_finite = o.check_finite;
  ecfg.enable_prefix_caching = !o.no_prefix_caching;
  ecfg.reserve_max_tokens = o.admission == "reserve";
  ecfg.nano_batching = o.nano.resolve(o.tp);
  return ecfg;
}

// What every pass of one eval shares: the model, the device, the workload and the engine's configuration.
struct EvalSetup {
  const Options& o;
  Device device;
  engine::ModelSpec spec;
  ParamOptions popts;
  int64_t max_model_len = 0;
  BuiltWorkload built;
  WorkloadStats stats;
  engine::EngineConfig ecfg;      // kv_cache_dtype set per pass
  std::optional<DType> kv_dtype;  // --kv-cache-dtype's pages (nullopt: the model's dtype)
  int64_t wave = 0;               // requests sent in waves of this many (0: all at once)
  const engine::Workload& workload() const { return built.workload; }
  const engine::WorkloadSpec& wspec() const { return built.workload.spec; }
};

// Resolves the device, the model, the dtype, the workload and the engine's configuration, checking the flags that
// depend on them.
EvalSetup make_setup(const Options& o, bool max_num_seqs_given) {
  const Device device = resolve_device(o.device);
  KBN_CHECK(engine::parse_execution_mode(o.mode) == engine::ExecutionMode::eager || device.is_cuda(),
            "--mode graph: CUDA graphs need a CUDA device; got ", device.str(), " (use --mode eager)");
  KBN_CHECK(!o.kernel_trace || device.is_cuda(), "--kernel-trace: needs a CUDA device (CUPTI), got ", device.str());
  engine::ModelSpec spec = resolve_model_spec(o.model, o.weights, device);
  const ParamOptions popts{select_dtype(o, spec, device), device};
  const int64_t max_pos = engine::max_positions(spec);
  const int64_t max_model_len = o.max_model_len > 0 ? o.max_model_len : max_pos;
  KBN_CHECK(max_model_len >= 2 && max_model_len <= max_pos, "--max-model-len: expected 2..", max_pos,
            " (the model's max_position_embeddings), got ", max_model_len);

  const std::string tok_path = resolve_tokenizer_path(o.tokenizer, o.weights, spec);
  BuiltWorkload built =
      build_workload(o, spec.config.language_model().get_int("vocab_size"), max_model_len, device.is_cpu(), tok_path);
  const engine::EngineConfig ecfg = engine_config(o, built.workload.spec, device, max_model_len, max_num_seqs_given);
  const std::optional<DType> kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype, "--kv-cache-dtype");

  if (o.num_kv_blocks > 0) {
    int64_t largest = 0;  // tokens of the longest request
    for (const auto& r : built.workload.requests)
      largest = std::max(largest, std::min(int64_t(r.prompt.size()) + r.sampling.max_tokens, max_model_len));
    const int64_t need = (largest + o.block_size - 1) / o.block_size;
    KBN_CHECK(need <= o.num_kv_blocks, "--num-kv-blocks: the longest request (", largest, " tokens) needs ", need,
              " blocks of ", o.block_size, " tokens; got ", o.num_kv_blocks);
  }
  const WorkloadStats stats = workload_stats(built.workload);
  const int64_t wave = built.workload.spec.max_num_seqs > 0 ? ecfg.max_num_seqs : 0;
  return EvalSetup{o, device, std::move(spec), popts, max_model_len, std::move(built), stats, ecfg, kv_dtype, wave};
}

void print_setup(const EvalSetup& e) {
  const Options& o = e.o;
  const WorkloadStats& w = e.stats;
  const engine::EngineConfig& ecfg = e.ecfg;
  const std::string weights =
      e.spec.weights_path.empty() ? "random weights (seed " + std::to_string(o.seed) + ")" : e.spec.weights_path;
  std::printf("kb_nano eval: workload %s (%s) on %s\n", e.wspec().name.c_str(), e.wspec().description.c_str(),
              e.spec.name.c_str());
  std::printf("  %s %s, %s, %s\n", e.device.str().c_str(), device_name(e.device).c_str(), dtype_name(e.popts.dtype),
              weights.c_str());
  std::printf("  %zu requests: prompt %lld..%lld (mean %.1f), output %lld..%lld (mean %.1f) tokens, greedy, seed %llu",
              e.workload().requests.size(), (long long)w.in_min, (long long)w.in_max,
              double(w.prompt_tokens) / w.requests, (long long)w.out_min, (long long)w.out_max,
              double(w.output_tokens) / w.requests, (unsigned long long)o.seed);
  if (e.workload().clipped > 0)
    std::printf("; %lld clipped to max_model_len %lld", (long long)e.workload().clipped, (long long)e.max_model_len);
  std::printf("\n");
  if (!e.built.shrunk.empty())
    std::printf("  CPU run, shrunk:%s; --num-requests%s give the %s workload\n", e.built.shrunk.c_str(),
                e.built.custom ? "" : " and --scale 1", e.built.custom ? "whole" : "canonical");
  std::printf("  engine: %s, block size %lld, max_num_batched_tokens %lld, max_num_seqs %lld, max_model_len %lld%s\n",
              o.mode.c_str(), (long long)ecfg.block_size, (long long)ecfg.max_num_batched_tokens,
              (long long)ecfg.max_num_seqs, (long long)ecfg.max_model_len,
              e.kv_dtype ? (std::string(", KV cache ") +
                            (o.compare_kv_cache_dtype ? std::string(dtype_name(e.popts.dtype)) + ", then " : "") +
                            dtype_name(*e.kv_dtype)).c_str()
                         : "");
  std::printf("  admission %s, prefix caching %s\n",
              ecfg.reserve_max_tokens ? "reserving every running request's max_tokens (no preemption)"
                                      : "optimistic (vLLM's; preemption by recompute)",
              ecfg.enable_prefix_caching ? "on" : "off");
  std::printf("  programmatic dependent launch %s\n",
              dependent_launch_enabled() ? "on (kbn/pdl.cuh's kernels; the default on Hopper: --no-pdl or KBN_PDL=0 for off)"
                                         : "off");
  if (o.nano.count > 1)
    std::printf("  nano-batches: %sup to %d per eager step (%s), of >= %lld tokens each, each on a stream of its "
                "own%s%s%s\n",
                o.compare_nano_batches ? "whole steps, then " : "", o.nano.count, o.nano.split.c_str(),
                (long long)o.nano.min_tokens,
                o.nano.gemm_sms > 0 ? (", GEMMs aimed at " + std::to_string(o.nano.gemm_sms) + " SMs").c_str()
                                          : "",
                o.nano.stagger ? ", staggered (each starts at the previous one's first attention)" : "",
                e.device.is_cuda() ? "" : " (on the CPU one after another)");
  if (o.async_scheduling || o.compare_async_scheduling)
    std::printf("  async scheduling: %seach greedy step is scheduled and launched before the previous one's token "
                "ids reach the host\n",
                o.compare_async_scheduling ? "synchronous steps, then " : "");
  if (e.wave > 0)
    std::printf("  requests sent in waves of %lld, each when the previous wave has finished\n", (long long)e.wave);
  std::fflush(stdout);
}

// The serial floor's rates, measured here before the weights and the KV cache take the device's memory, or why there
// are none.
FloorSetup measure_floor_setup(Device device, DType dtype) {
  FloorSetup floor_setup;
  if (!device.is_cuda()) {
    floor_setup.unavailable = "CPU run: no GPU rates to take the floor at";
    return floor_setup;
  }
  if (dtype != DType::bf16 && dtype != DType::f16) {
    floor_setup.unavailable = std::string("--dtype ") + dtype_name(dtype) +
                              ": the floor's GEMM rate is the measured bf16 tensor-core rate, which " +
                              dtype_name(dtype) + " GEMMs do not reach";
    return floor_setup;
  }
  std::printf("  measuring the serial floor's rates (copy bandwidth, bf16 GEMM) on %s...\n", device.str().c_str());
  std::fflush(stdout);
  {
    const DeviceGuard guard(device);
    const bench::Ceilings c = bench::measure_ceilings();
    floor_setup.rates = engine::FloorRates{c.copy_gb_per_s * 1e9, c.bf16_tflop_per_s * 1e12};
  }
  // The GEMM's operands went through the caching allocator: give them back before the KV cache is sized.
  cuda_empty_cache();
  std::printf("  copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", floor_setup.rates->copy_bytes_per_s / 1e9,
              floor_setup.rates->gemm_flop_per_s / 1e12);
  return floor_setup;
}

// One pass: its model (the same seed for every pass: the same weights) and engine, a warm-up request outside the
// timed run, then the workload, with its serial floor at `rates` when there are some.
VariantRun run_pass(const EvalSetup& e, const Pass& pass, const engine::FloorModel& floor_model,
                    const std::optional<engine::FloorRates>& rates, engine::TensorParallelGroup* group) {
  VariantRun run;
  run.name = pass.name;
  run.kv_cache_dtype = pass.kv_cache_dtype;
  run.nano_batches = pass.nano_batches;
  run.async_scheduling = pass.async_scheduling;
  engine::EngineConfig ecfg = e.ecfg;
  ecfg.kv_cache_dtype = pass.kv_cache_dtype;
  ecfg.nano_batching.count = pass.nano_batches;
  ecfg.async_scheduling = pass.async_scheduling;
  const ModelEngine m = build_model_engine(e.spec, pass.variant, e.popts, e.o.seed, e.device, ecfg, group);
  engine::LLMEngine& eng = *m.engine;
  run.sizing = eng.kv_cache_sizing();
  KBN_CHECK(eng.runner().kv_bytes_per_token() == floor_model.kv_bytes_per_token(), "eval: the serial floor counts ",
            floor_model.kv_bytes_per_token(), " KV bytes per token for ", e.spec.name, " but its paged layers hold ",
            eng.runner().kv_bytes_per_token(), " (engine/serial_floor.cpp and the model's cache specs disagree)");
  std::printf("  [%s] KV cache: %s\n", run.name.c_str(), run.sizing.explanation.c_str());
  if (parse_kv_cache_dtype(pass.kv_cache_dtype, "--kv-cache-dtype")) {
    // Which per-tensor scales the fp8 pages use: the checkpoint's calibrated ones, or vLLM's default 1.0.
    const KVScaleRange r = kv_scale_range(m.model ? *m.model : *m.shards.front());
    if (r.all_one())
      std::printf("  [%s] fp8 KV scales: 1.0 (the checkpoint has no k_scale / v_scale)\n", run.name.c_str());
    else
      std::printf("  [%s] fp8 KV scales from the checkpoint over %lld layers: k_scale %.4g..%.4g, v_scale %.4g..%.4g\n",
                  run.name.c_str(), (long long)r.layers, r.k_min, r.k_max, r.v_min, r.v_max);
  }
  if (const engine::CudaGraphRunner* graphs = eng.runner().cuda_graphs()) {
    run.graph_sizes = graphs->sizes();
    run.graph_capture_s = graphs->capture_seconds();
    run.graph_capture_bytes = graphs->capture_bytes();
    std::printf("  [%s] CUDA graphs: %zu decode batch sizes (%lld..%lld) captured in %.2f s, %.1f MiB\n",
                run.name.c_str(), run.graph_sizes.size(), (long long)run.graph_sizes.front(),
                (long long)run.graph_sizes.back(), run.graph_capture_s,
                double(run.graph_capture_bytes) / double(1 << 20));
  }
  std::fflush(stdout);
  warm_up(eng, e.max_model_len, 4);  // outside the timed run
  Progress progress(run.name.c_str());
  const int64_t graph_steps_before = eng.runner().num_graph_steps();
  const int64_t nano_steps_before = eng.runner().num_nano_batched_steps();
  const auto flushes = [&] {
    return e.device.is_cuda() ? int64_t(cuda_allocator_stats(e.device.index).num_cache_flushes) : int64_t(0);
  };
  const int64_t flushes_before = flushes();
  std::unique_ptr<engine::KernelTracer> tracer;
  if (e.o.kernel_trace) tracer = std::make_unique<engine::KernelTracer>();
  run.result = run_workload(eng, e.workload().requests, e.wave, progress);
  if (tracer) {
    run.trace = tracer->stop();
    run.traced = true;
  }
  run.metrics = run.result.metrics();
  run.graph_steps = eng.runner().num_graph_steps() - graph_steps_before;
  run.nano_steps = eng.runner().num_nano_batched_steps() - nano_steps_before;
  run.cache_flushes = flushes() - flushes_before;
  if (rates) run.floor = engine::serial_floor(floor_model, run.result.step_shapes, *rates);
  return run;
}

// Two passes' greedy outputs compared and, when asked and possible, their first divergences scored by the baseline.
struct AlignmentReport {
  engine::Alignment al;
  engine::DivergenceSummary div;
  bool div_scored = false;
};

AlignmentReport align_runs(const EvalSetup& e, const std::vector<VariantRun>& runs, bool tensor_parallel) {
  AlignmentReport a;
  std::vector<std::vector<int64_t>> prompts, base, cand;
  for (size_t i = 0; i < e.workload().requests.size(); ++i) {
    prompts.push_back(e.workload().requests[i].prompt);
    base.push_back(runs[0].result.outputs[i].tokens);
    cand.push_back(runs[1].result.outputs[i].tokens);
  }
  a.al = engine::align(base, cand);
  const engine::Alignment& al = a.al;
  std::printf(
      "\ngreedy alignment, %s vs %s: %lld/%lld requests identical (%.1f%%); matching prefix mean %.1f "
      "tokens (%.1f%% of the baseline output), min %lld\n",
      runs[1].name.c_str(), runs[0].name.c_str(), (long long)al.exact, (long long)al.requests,
      al.requests ? 100.0 * double(al.exact) / double(al.requests) : 0.0, al.mean_prefix, 100.0 * al.mean_prefix_frac,
      (long long)al.min_prefix);
  if (al.exact < al.requests && e.o.divergence_samples > 0 && !tensor_parallel) {
    // The baseline model again (same seed, same weights), alone on the device, judges the first divergences.
    std::unique_ptr<CausalLM> model = engine::build_model(e.spec, Variant::baseline, e.popts, e.o.seed);
    a.div = engine::analyse_divergences(*model, e.device, Variant::baseline, prompts, base, cand,
                                        e.o.divergence_samples, e.ecfg.max_num_batched_tokens);
    a.div_scored = true;
    const engine::DivergenceSummary& div = a.div;
    std::printf(
        "first divergences as the baseline sees them (%lld scored of %lld diverged requests; teacher-forced on the "
        "common prefix): its logit for its own token minus the candidate's, median %.4g (%.3g stds of its logits), "
        "max %.4g (%.3g stds); the candidate's token was the baseline's first or second choice in %.1f%%\n",
        (long long)div.scored, (long long)div.diverged, div.median_margin, div.median_margin_over_std, div.max_margin,
        div.max_margin_over_std, 100.0 * div.rank2_fraction);
  } else if (al.exact < al.requests && tensor_parallel) {
    std::printf("first divergences: not scored under --tp > 1 (the judging rerun needs the whole model on one device)\n");
  }
  return a;
}

nlohmann::json alignment_json(const AlignmentReport& a) {
  const engine::Alignment& al = a.al;
  nlohmann::json j = {{"requests", al.requests},
                      {"exact_match", al.exact},
                      {"exact_match_rate", al.requests ? double(al.exact) / double(al.requests) : 0.0},
                      {"mean_matching_prefix", al.mean_prefix},
                      {"mean_matching_prefix_fraction", al.mean_prefix_frac},
                      {"min_matching_prefix", al.min_prefix},
                      {"matching_prefix", al.prefix}};
  if (a.div_scored) {
    const engine::DivergenceSummary& div = a.div;
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& d : div.samples)
      samples.push_back({{"request", d.request},
                         {"position", d.position},
                         {"baseline_token", d.baseline_token},
                         {"candidate_token", d.candidate_token},
                         {"margin", d.margin},
                         {"logit_std", d.logit_std},
                         {"top_gap", d.top_gap},
                         {"candidate_rank", d.candidate_rank}});
    j["divergences"] = {{"diverged", div.diverged},
                        {"scored", div.scored},
                        {"median_margin", div.median_margin},
                        {"max_margin", div.max_margin},
                        {"median_margin_over_std", div.median_margin_over_std},
                        {"max_margin_over_std", div.max_margin_over_std},
                        {"rank2_fraction", div.rank2_fraction},
                        {"samples", samples}};
  }
  return j;
}

void write_json(const EvalSetup& e, const std::vector<VariantRun>& runs, const FloorSetup& floor_setup,
                const AlignmentReport* alignment, const std::string& tp_collectives) {
  const Options& o = e.o;
  const engine::EngineConfig& ecfg = e.ecfg;
  const WorkloadStats& w = e.stats;
  const BuildInfo& b = build_info();
  nlohmann::json j;
  j["provenance"] = {{"commit", b.git_commit},
                     {"build_type", b.build_type},
                     {"with_cuda", b.with_cuda},
                     {"cuda_version", b.cuda_version},
                     {"gencode", b.cuda_flags},
                     {"device", e.device.str()},
                     {"device_name", device_name(e.device)},
                     {"date", utc_now()},
                     {"command_line", command_line()},
                     {"seed", o.seed}};
  j["config"] = {{"model", e.spec.name},
                 {"config_path", e.spec.config_path},
                 {"weights", e.spec.weights_path.empty() ? "random" : e.spec.weights_path},
                 {"dtype", dtype_name(e.popts.dtype)},
                 {"mode", o.mode},
                 {"workload", e.wspec().name},
                 {"workload_description", e.wspec().description},
                 {"num_requests", int64_t(e.workload().requests.size())},
                 {"scale", e.built.options.scale},
                 {"clipped_requests", e.workload().clipped},
                 {"block_size", ecfg.block_size},
                 {"prefix_caching", ecfg.enable_prefix_caching},
                 {"kv_cache_dtype", o.kv_cache_dtype},
                 {"compare_kv_cache_dtype", o.compare_kv_cache_dtype},
                 {"nano_batches", o.nano.count},
                 {"nano_batch_min_tokens", o.nano.min_tokens},
                 {"nano_batch_split", o.nano.split},
                 {"nano_batch_stagger", o.nano.stagger},
                 {"nano_batch_gemm_sms", o.nano.gemm_sms},
                 {"dependent_launch", dependent_launch_enabled()},
                 {"compare_nano_batches", o.compare_nano_batches},
                 {"async_scheduling", o.async_scheduling},
                 {"compare_async_scheduling", o.compare_async_scheduling},
                 {"admission", o.admission},
                 {"reserve_max_tokens", ecfg.reserve_max_tokens},
                 {"num_kv_blocks_requested", o.num_kv_blocks},
                 {"max_num_batched_tokens", ecfg.max_num_batched_tokens},
                 {"max_num_seqs", ecfg.max_num_seqs},
                 {"tp", o.tp},
                 {"tp_collectives", tp_collectives},
                 {"wave_size", e.wave},
                 {"max_model_len", ecfg.max_model_len},
                 {"gpu_memory_utilization", ecfg.gpu_memory_utilization}};
  j["workload"] = {
      {"prompt_tokens", w.prompt_tokens},
      {"output_tokens", w.output_tokens},
      {"prompt_len", {{"min", w.in_min}, {"max", w.in_max}, {"mean", double(w.prompt_tokens) / w.requests}}},
      {"output_len", {{"min", w.out_min}, {"max", w.out_max}, {"mean", double(w.output_tokens) / w.requests}}}};
  for (const auto& r : runs) {
    nlohmann::json& jr = j["results"][r.name];
    jr = metrics_json(r);
    jr["serial_floor"] = serial_floor_json(r, floor_setup);
    jr["kv_cache_dtype"] = r.kv_cache_dtype;
    if (o.step_profile) jr["step_profile"] = step_profile_json(r.result.profile);
    if (r.traced) jr["kernel_trace"] = kernel_trace_json(r.trace);
  }
  if (alignment) j["alignment"] = alignment_json(*alignment);
  std::ofstream out(o.json);
  KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
  out << j.dump(2) << "\n";
}

void run(const Options& o, bool max_num_seqs_given) {
  if (!o.url.empty()) return run_url(o, max_num_seqs_given);
  check_run_flags(o, max_num_seqs_given);
  KBN_CHECK(!(o.pdl && o.no_pdl), "--pdl and --no-pdl: pass one of them");
  if (o.pdl) set_dependent_launch(true);
  if (o.no_pdl) set_dependent_launch(false);
  const std::vector<Pass> passes = select_passes(o);
  const EvalSetup e = make_setup(o, max_num_seqs_given);
  print_setup(e);

  // The serial floor: the model's per-step work from its shapes (one rank's under --tp) at the measured rates.
  const ModelView floor_view =
      ModelView::from(e.spec.name, std::make_shared<const ModelConfig>(e.spec.config.language_model()), o.tp);
  const FloorSetup floor_setup = measure_floor_setup(e.device, e.popts.dtype);

  // Tensor parallel: one rank thread per GPU (or CPU rank), kept for every pass.
  std::unique_ptr<engine::TensorParallelGroup> group;
  if (o.tp > 1) {
    group = std::make_unique<engine::TensorParallelGroup>(o.tp, e.device);
    std::printf("  tensor parallel %d: %s; collectives: %s\n", o.tp,
                e.device.is_cpu() ? "CPU ranks" : "rank r on cuda:r", group->collectives().c_str());
    if (e.spec.weights_path.empty())
      std::printf("  note: random weights are drawn per shard, so --tp %d is a different random model from --tp 1\n",
                  o.tp);
  }
  std::vector<VariantRun> runs;
  for (const Pass& pass : passes) {
    const std::optional<DType> kv = parse_kv_cache_dtype(pass.kv_cache_dtype, "--kv-cache-dtype");
    const engine::FloorModel floor_model(floor_view, int64_t(dtype_size(e.popts.dtype)),
                                         int64_t(dtype_size(kv.value_or(e.popts.dtype))));
    runs.push_back(run_pass(e, pass, floor_model, floor_setup.rates, group.get()));
    // The next pass's model and cache get the whole device.
    if (e.device.is_cuda()) cuda_empty_cache();
  }

  std::printf("\n");
  print_table(runs);
  print_serial_floor(runs, floor_setup);
  if (o.step_profile)
    for (const auto& r : runs) print_step_profile(r, e.device);
  for (const auto& r : runs)
    if (r.traced) print_kernel_trace(r);
  std::optional<AlignmentReport> alignment;
  if (runs.size() == 2) alignment = align_runs(e, runs, group != nullptr);

  if (!o.json.empty())
    write_json(e, runs, floor_setup, alignment ? &*alignment : nullptr, group ? group->collectives() : std::string());
  if (!o.csv.empty()) write_csv(o.csv, runs, e.spec.name, e.wspec().name, o.mode, floor_setup);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("eval",
                                     "Serving throughput and latency of the continuous-batching engine on a seeded "
                                     "workload; baseline and candidate side by side with greedy alignment");
  cmd->add_option("--model", o->model,
                  "Model name from models/, a config.json, or a local HF folder "
                  "(default: tiny-llama on CPU, llama-3.1-8b-instruct on GPU)");
  std::string names;
  for (const auto& w : engine::workload_specs()) names += (names.empty() ? "" : ", ") + w.name;
  auto* workload = cmd->add_option("--workload", o->workload, "One of " + names + " (default balanced)");
  cmd->add_option("--mode", o->mode,
                  "eager (default) or graph: decode-only steps replay CUDA graphs captured at start-up for batch "
                  "sizes 1, 2, 4, 8, 16, 24, ... up to min(max-num-seqs, 512) (CUDA only)");
  cmd->add_option("--num-requests", o->num_requests,
                  "Requests to run (default: the workload's count; " + std::to_string(kCpuDefaultRequests) +
                      " on CPU; 0 = default)")
      ->check(integer_at_least(0));
  auto* input_len = cmd->add_option("--input-len", o->input_len,
                                    "vLLM's random workload instead of --workload: prompts of this many tokens "
                                    "(default 1024 when --output-len or --range-ratio is given), random ids, all "
                                    "requests at once")
                        ->check(integer_at_least(1));
  auto* output_len = cmd->add_option("--output-len", o->output_len,
                  "Output tokens per request of the random workload (default 128), or of a --dataset line without "
                  "its own output_len")
      ->check(integer_at_least(1));
  cmd->add_option("--num-prompts", o->num_prompts,
                  "vLLM's name for --num-requests (the random workload's default: 1000; give one of the two)")
      ->check(integer_at_least(1));
  auto* range_ratio = cmd->add_option("--range-ratio", o->range_ratio,
                                      "Lengths of the random workload uniform in [len (1 - r), len (1 + r)], r in "
                                      "[0, 1) (vLLM's --random-range-ratio; default 0)")
                          ->check(fraction_below_one());
  auto* dataset = cmd->add_option("--dataset", o->dataset,
                                  "A JSONL file of requests instead of --workload, one per line: "
                                  "{\"prompt_token_ids\": [...], \"output_len\": N} or {\"prompt\": \"text\", ...} "
                                  "(output_len optional: --output-len; text is encoded with the model's tokenizer)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "A Hugging Face tokenizer.json for a --dataset's text prompts (default: the model's own)");
  dataset->excludes(input_len)->excludes(range_ratio);
  workload->excludes(input_len)->excludes(range_ratio)->excludes(dataset)->excludes(output_len);
  cmd->add_option(
      "--scale", o->scale,
      "Multiply every prompt and output length (default 1; " + fmt("%g", kCpuDefaultScale) + " on CPU; 0 = default)")
      ->check(positive_number(true));
  cmd->add_option("--json", o->json,
                  "Write metrics per variant (with the serial floor on a GPU), alignment, config and provenance to "
                  "this file");
  cmd->add_option("--url", o->url,
                  "Measure a running OpenAI-compatible server (kb_nano serve) at this http://host:port instead of an "
                  "engine here, as vllm bench serve does: streamed /v1/completions, TTFT/TPOT/ITL/E2EL percentiles");
  cmd->add_option("--request-rate", o->request_rate,
                  "With --url: Poisson arrivals at this many requests per second (default inf: all at once)");
  cmd->add_option("--max-concurrency", o->max_concurrency, "With --url: requests in flight at most (default: no limit)")
      ->check(integer_at_least(0));
  cmd->add_option("--csv", o->csv,
                  "Write one line per variant as CSV (throughput, latency percentiles in ms, serial floor) to this file");
  cmd->add_flag("--step-profile", o->step_profile,
                "Record where each step's time goes (host scheduling, input building, sampling; device spans of the "
                "forward and the logits) and print it by kind of step; a step that samples nothing then waits for "
                "the device, so throughput runs are best made without it");
  cmd->add_flag("--kernel-trace", o->kernel_trace,
                "Record every kernel of the measured run with CUPTI and print the GPU time per op (rms_norm, linear, "
                "flash_attn_decode, ...) and the top kernels; --json adds them (CUDA only; libcupti is opened at run "
                "time, $KBN_CUPTI_LIBRARY overrides where; tracing adds a little time per kernel); on bf16/f16 runs "
                "each op's share of the serial floor beside it");
  cmd->add_flag("--check-finite", o->check_finite,
                "Check the logits of every step that samples for NaN/Inf and on the first failure name the first layer "
                "whose output was not finite (from the KV cache each layer wrote); one device-to-host copy of the "
                "logits per step, so throughput runs are best made without it");
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching,
                "Turn automatic prefix caching off (on by default, as in vLLM V1): every admitted request, and every "
                "preempted one coming back, computes all of its tokens");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "auto (default: the model's dtype) or fp8 / fp8_e4m3 (vLLM's: fp8 e4m3 pages, half of a 16-bit "
                  "cache, with the checkpoint's per-tensor k_scale / v_scale, else 1.0; the attention ops read them on "
                  "tensor cores: on Hopper, decode at heads 64 / 128 / 256 on its tensor-core kernel, prefill at heads "
                  "64 / 128 on the TMA / wgmma kernel, other heads on mma.sync)");
  cmd->add_flag("--compare-kv-cache-dtype", o->compare_kv_cache_dtype,
                "Run the baseline twice, with the model's dtype in the KV pages and then with --kv-cache-dtype's, and "
                "report both and their greedy alignment with the first divergences scored (fp8 KV's accuracy cost)");
  o->nano.add_to(cmd);
  cmd->add_flag("--pdl", o->pdl,
                "Programmatic dependent launch (Hopper): kb-nano's decode-path kernels (the README lists them) may be "
                "scheduled while the kernel before them drains, and wait in-kernel for it (kbn/pdl.cuh). On by default "
                "where the GPU has it (compute capability 9.0+); this flag forces it on (KBN_PDL=1 for any command)");
  cmd->add_flag("--no-pdl", o->no_pdl,
                "Programmatic dependent launch off: every kernel waits for the one before it to finish before it is "
                "scheduled (KBN_PDL=0 for any command)");
  cmd->add_flag("--compare-nano-batches", o->compare_nano_batches,
                "Run the baseline twice, with whole steps and then with --nano-batches, and report both and their "
                "greedy alignment");
  cmd->add_flag("--async-scheduling", o->async_scheduling,
                "Async scheduling (vLLM's): a step whose sampling is greedy is launched and the next one scheduled and "
                "launched before its token ids reach the host, which the next step takes on the device; the host's "
                "scheduling and launches then run under the GPU's work instead of between steps. The same tokens; a "
                "request that stops at EOS computes one discarded token. Steps with non-greedy sampling stay "
                "synchronous. --tp 1, not with --step-profile");
  cmd->add_flag("--compare-async-scheduling", o->compare_async_scheduling,
                "Run the baseline twice, with synchronous steps and then with --async-scheduling, and report both and "
                "their greedy alignment");
  cmd->add_option("--admission", o->admission,
                  "reserve (default): admit a request only while every running request can still reach its "
                  "max_tokens, so nothing is preempted (exact for these ignore_eos workloads, whose requests all run to "
                  "max_tokens); optimistic: vLLM's admission, which admits while blocks are free and preempts by "
                  "recompute when the cache runs out");
  cmd->add_option("--divergence-samples", o->divergence_samples,
                  "With a candidate: score the first divergence of up to this many differing requests (evenly "
                  "spaced) by rerunning the baseline on their common prefix, to tell near-ties (rounding) from "
                  "choices the baseline ranks clearly lower (default 64; 0 = off)")
      ->check(integer_at_least(0));
  cmd->add_option("--seed", o->seed, "Seed of the workload and of random weights (default 0)")->check(seed_value());
  cmd->add_option("--variant", o->variant, "baseline, candidate or both (default: both when a candidate is built)");
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                  "Token budget per step (default as vLLM's offline engine: 16384 on a >= 70 GiB GPU other than an "
                  "A100, else 8192; 0 = this default)")
      ->check(integer_at_least(0));
  CLI::Option* seqs = cmd->add_option("--max-num-seqs", o->max_num_seqs,
                                      "Running sequences at most (default as vLLM's offline engine: 1024 on a >= 70 GiB GPU other "
                                      "than an A100, else 256; latency-b1/b32: 1/32)")
                                  ->check(integer_at_least(1));
  cmd->add_option("--block-size", o->block_size, "KV cache block size in tokens (default 16)")
      ->check(integer_at_least(1));
  cmd->add_option("--tp", o->tp,
                  "Tensor-parallel size: one thread per rank, rank r on cuda:r (NCCL; decode-sized all-reduces over peer "
                  "memory) or, with --device cpu, on the "
                  "CPU (default 1)");
  cmd->add_option("--num-kv-blocks", o->num_kv_blocks,
                  "KV cache blocks (default: from free GPU memory; on CPU enough for max_num_seqs x max_model_len "
                  "up to 1 GiB; 0 = this default)")
      ->check(integer_at_least(0));
  cmd->add_option("--max-model-len", o->max_model_len,
                  "Prompt + output tokens per request at most; longer requests are clipped to it (default: the "
                  "config's max_position_embeddings)")
      ->check(integer_at_least(2));
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Share of GPU memory for weights, activations and KV cache (default 0.9)")
      ->check(positive_number());
  cmd->add_option("--weights", o->weights, "HF folder or .safetensors file (default: seeded random weights)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: f32 on CPU, the config's dtype on GPU)");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda:0 when a GPU is present)");
  cmd->callback([o, seqs] { run(*o, seqs->count() > 0); });
}

}  // namespace kbn::cli
