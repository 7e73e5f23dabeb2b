// kb_nano kernels: measured speed of the L1 ops at shapes derived from real model configs, against ceilings
// measured on this GPU at start-up (bench/timing.h states the timing contract).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/ceilings.h"
#include "bench/correctness.h"
#include "bench/timing.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "kbn/allocator.h"
#include "kbn/module.h"
#include "kbn/registry.h"
#include "kbn/rng.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

constexpr double kWeightStd = 0.02;

struct Options {
  std::vector<std::string> targets;
  int level = 1;
  std::vector<std::string> models;
  std::vector<int64_t> tps;
  std::string tokens;
  std::vector<std::string> case_labels;
  std::string mode = "cold";
  std::string dtype = "bf16";
  uint64_t seed = 0;
  std::string json;
  std::string markdown;
  bool list = false;
};

struct Row {
  const bench::BenchCase* c = nullptr;
  bench::CheckResult check;
  bench::Timing timing;
  std::string error;  // an exception while building, checking or timing the case
  double gb_per_s = 0, tflop_per_s = 0, pct_copy = 0, pct_bf16 = 0;
  std::string bound;
};

std::vector<int64_t> parse_tokens(const std::string& s) {
  std::vector<int64_t> out;
  if (s.empty()) return out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KBN_CHECK(used == tok.size() && !tok.empty() && v > 0,
              "--tokens: expected comma-separated positive integers like 1,8,512, got '", s, "'");
    out.push_back(v);
  }
  return out;
}

// "all": every real Llama config in models/ (the tiny-* configs are test fixtures, not deployments).
std::vector<std::string> expand_models(const std::vector<std::string>& requested) {
  std::vector<std::string> names = requested.empty() ? std::vector<std::string>{"llama-3.1-8b-instruct"} : requested;
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n != "all") {
      out.push_back(n);
      continue;
    }
    for (const auto& m : engine::known_models()) {
      if (m.rfind("tiny-", 0) == 0) continue;
      const auto archs = engine::resolve_model(m).config.architectures();
      if (std::find(archs.begin(), archs.end(), "LlamaForCausalLM") != archs.end()) out.push_back(m);
    }
  }
  return out;
}

std::vector<bench::BenchCase> build_cases(const Options& o) {
  KBN_CHECK(o.level == 1, "--level: only level 1 (single kernels) is benchmarked so far, got ", o.level);
  bench::CaseOptions copts;
  copts.tokens = parse_tokens(o.tokens);
  copts.dtype = parse_dtype(o.dtype);
  const std::vector<std::string>& targets = o.targets.empty() ? bench::llama_l1_ops() : o.targets;
  const std::vector<int64_t> tps = o.tps.empty() ? std::vector<int64_t>{1} : o.tps;
  std::vector<bench::BenchCase> cases;
  for (const auto& model : expand_models(o.models)) {
    engine::ModelSpec spec = engine::resolve_model(model);
    const auto archs = spec.config.architectures();
    KBN_CHECK(std::find(archs.begin(), archs.end(), "LlamaForCausalLM") != archs.end(), "--model: '", model,
              "' is not a LlamaForCausalLM config; kb_nano kernels derives Llama shapes only");
    const LlamaConfig config = LlamaConfig::from(spec.config);
    for (int64_t tp : tps) {
      for (const auto& op : targets) {
        for (auto& c : bench::cases_for(op, spec.name, config, tp, copts)) cases.push_back(std::move(c));
      }
    }
  }
  if (!o.case_labels.empty()) {
    const std::set<std::string> wanted(o.case_labels.begin(), o.case_labels.end());
    std::set<std::string> matched;
    std::vector<bench::BenchCase> kept;
    for (auto& c : cases) {
      if (!wanted.count(c.label)) continue;
      matched.insert(c.label);
      kept.push_back(std::move(c));
    }
    for (const auto& w : wanted)
      KBN_CHECK(matched.count(w), "--case: no case is labelled '", w, "' (kb_nano kernels --list shows the labels)");
    cases = std::move(kept);
  }
  return cases;
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

std::string rerun_command(const bench::BenchCase& c, const Options& o) {
  return "kb_nano kernels --target " + c.op + " --model " + c.model + " --tp " + std::to_string(c.tp) + " --tokens " +
         std::to_string(c.tokens) + " --mode " + o.mode + " --seed " + std::to_string(o.seed) + " --dtype " +
         dtype_name(c.dtype) + " --case " + shell_quote(c.label);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void fill_roofline(Row& r, const bench::Ceilings& ceil) {
  if (!r.timing.ok || r.timing.median_ms <= 0) return;
  const double seconds = r.timing.median_ms * 1e-3;
  r.gb_per_s = double(r.c->bytes) / seconds / 1e9;
  r.tflop_per_s = double(r.c->flops) / seconds / 1e12;
  r.pct_copy = 100.0 * r.gb_per_s / ceil.copy_gb_per_s;
  r.pct_bf16 = 100.0 * r.tflop_per_s / ceil.bf16_tflop_per_s;
  const double memory_floor = double(r.c->bytes) / (ceil.copy_gb_per_s * 1e9);
  const double compute_floor = double(r.c->flops) / (ceil.bf16_tflop_per_s * 1e12);
  r.bound = memory_floor > compute_floor ? "memory" : "compute";
}

Row run_case(const bench::BenchCase& c, const Options& o, const bench::DeviceInfo& dev, const bench::Ceilings& ceil,
             const bench::TimingOptions& topts) {
  Row r;
  r.c = &c;
  try {
    const OpEntry& entry = registry(Variant::baseline).get(c.op);
    OpArgs gpu_args = c.args;
    gpu_args.opts = ParamOptions{c.dtype, Device::cuda(dev.index)};
    std::unique_ptr<AnyOp> op = entry.make(gpu_args);
    init_random_weights(op->module(), o.seed, kWeightStd);

    // NOTE: cold mode rotates among input sets totalling > 3x L2 so no call finds its inputs in L2 from the
    // previous one; hot and graph modes reuse one set.
    const int sets = topts.mode == bench::TimingMode::cold ? bench::cold_input_sets(c.input_bytes, dev.l2_bytes) : 1;
    std::vector<std::vector<Tensor>> inputs;
    for (int s = 0; s < sets; ++s) inputs.push_back(c.make_inputs(Device::cuda(dev.index), o.seed + uint64_t(s)));

    if (bench::fits_cpu_oracle(c)) {
      OpArgs cpu_args = c.args;
      cpu_args.opts = ParamOptions{c.dtype, Device::cpu()};
      std::unique_ptr<AnyOp> cpu_op = entry.make(cpu_args);
      init_random_weights(cpu_op->module(), o.seed, kWeightStd);
      r.check = bench::check_against_cpu(*op, *cpu_op, inputs[0]);
    } else {
      r.check.detail = "too large for the CPU oracle";
    }
    if (r.check.status == bench::CheckStatus::fail) {
      r.timing.skipped = "not timed: output check failed";
    } else {
      r.timing = bench::time_op([&](int s) { op->call(inputs[size_t(s)]); }, sets, c.graph_capturable, topts);
      fill_roofline(r, ceil);
    }
  } catch (const Error& e) {
    r.error = e.what();
  }
  cuda_empty_cache();  // NOTE: each case starts from an empty cache, so large cases cannot fragment later ones
  return r;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

struct Group {
  std::string title;
  std::vector<const Row*> rows;
};

std::vector<std::string> row_cells(const Row& r) {
  const auto& t = r.timing;
  std::string status = r.error.empty() ? bench::check_status_name(r.check.status) : "ERROR";
  if (!t.ok) {
    std::string why = !r.error.empty() ? r.error : t.skipped;
    return {r.c->label, status, why, "", "", "", "", "", ""};
  }
  return {r.c->label,
          status,
          fmt("%.2f", t.median_ms * 1e3),
          fmt("%.2f", t.p10_ms * 1e3) + "-" + fmt("%.2f", t.p90_ms * 1e3),
          fmt("%.1f", r.gb_per_s),
          fmt("%.2f", r.tflop_per_s),
          fmt("%.1f", r.pct_copy),
          fmt("%.1f", r.pct_bf16),
          r.bound};
}

const std::vector<std::string>& headers() {
  static const std::vector<std::string> h = {"case",    "check",     "median us", "p10-p90 us", "GB/s",
                                             "TFLOP/s", "% copy BW", "% bf16",    "bound"};
  return h;
}

void print_table(const Group& g) {
  std::printf("\n%s\n", g.title.c_str());
  std::vector<std::vector<std::string>> lines{headers()};
  for (const Row* r : g.rows) lines.push_back(row_cells(*r));
  std::vector<size_t> width(headers().size(), 0);
  for (const auto& l : lines)
    for (size_t i = 0; i + 1 < l.size(); ++i) width[i] = std::max(width[i], l[i].size());
  for (const auto& l : lines) {
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      out += l[i];
      if (i + 1 < l.size()) out += std::string(width[i] - l[i].size() + 2, ' ');
    }
    std::printf("%s\n", out.c_str());
  }
  std::fflush(stdout);
}

nlohmann::json provenance(const bench::DeviceInfo& dev, const bench::Ceilings& ceil, const Options& o) {
  const BuildInfo& b = build_info();
  nlohmann::json p;
  p["commit"] = b.git_commit;
  p["build_type"] = b.build_type;
  p["cuda_version"] = b.cuda_version;
  p["gencode"] = b.cuda_flags;
  p["device"] = {{"index", dev.index},
                 {"name", dev.name},
                 {"sm_count", dev.sm_count},
                 {"l2_bytes", dev.l2_bytes},
                 {"memory_bytes", dev.memory_bytes},
                 {"clock_khz", dev.clock_khz},
                 {"memory_clock_khz", dev.memory_clock_khz},
                 {"driver_version", dev.driver_version},
                 {"runtime_version", dev.runtime_version}};
  p["date"] = utc_now();
  p["ceilings"] = {{"copy_gb_per_s", ceil.copy_gb_per_s}, {"bf16_tflop_per_s", ceil.bf16_tflop_per_s}};
  p["mode"] = o.mode;
  p["seed"] = o.seed;
  p["variant"] = "baseline";
  return p;
}

nlohmann::json row_json(const Row& r, const Options& o) {
  const auto& c = *r.c;
  const auto& t = r.timing;
  nlohmann::json j;
  j["op"] = c.op;
  j["model"] = c.model;
  j["tp"] = c.tp;
  j["case"] = c.label;
  j["tokens"] = c.tokens;
  j["dtype"] = dtype_name(c.dtype);
  j["mode"] = o.mode;
  j["bytes"] = c.bytes;
  j["flops"] = c.flops;
  j["check"] = bench::check_status_name(r.check.status);
  j["check_detail"] = r.check.detail;
  j["timed"] = t.ok;
  if (t.ok) {
    j["median_ms"] = t.median_ms;
    j["p10_ms"] = t.p10_ms;
    j["p90_ms"] = t.p90_ms;
    j["host_wall_median_ms"] = t.host_wall_median_ms;
    j["iterations"] = t.iterations;
    j["input_sets"] = t.input_sets;
    j["gb_per_s"] = r.gb_per_s;
    j["tflop_per_s"] = r.tflop_per_s;
    j["pct_copy_bandwidth"] = r.pct_copy;
    j["pct_bf16_rate"] = r.pct_bf16;
    j["bound"] = r.bound;
  } else {
    j["skipped"] = r.error.empty() ? t.skipped : "";
  }
  if (!r.error.empty()) j["error"] = r.error;
  if (!c.note.empty()) j["note"] = c.note;
  j["rerun"] = rerun_command(c, o);
  return j;
}

void write_markdown(const std::string& path, const std::vector<Group>& groups, const bench::DeviceInfo& dev,
                    const bench::Ceilings& ceil, const Options& o) {
  std::ofstream md(path);
  KBN_CHECK(md.good(), "--markdown: cannot write '", path, "'");
  const BuildInfo& b = build_info();
  md << "# kb_nano kernels (" << o.mode << ", seed " << o.seed << ")\n\n"
     << dev.name << ", " << dev.sm_count << " SMs, L2 " << (dev.l2_bytes >> 20) << " MiB, driver " << dev.driver_version
     << "; commit " << b.git_commit << " (" << b.build_type << ", CUDA " << b.cuda_version << "); " << utc_now()
     << "\n\nCeilings measured at start-up: copy " << fmt("%.0f", ceil.copy_gb_per_s) << " GB/s, bf16 GEMM "
     << fmt("%.0f", ceil.bf16_tflop_per_s) << " TFLOP/s.\n";
  for (const auto& g : groups) {
    md << "\n## " << g.title << "\n\n|";
    for (const auto& h : headers()) md << " " << h << " |";
    md << "\n|";
    for (size_t i = 0; i < headers().size(); ++i) md << " --- |";
    md << "\n";
    for (const Row* r : g.rows) {
      md << "|";
      for (const auto& cell : row_cells(*r)) md << " " << cell << " |";
      md << "\n";
    }
  }
}

void run(const Options& o) {
  const std::vector<bench::BenchCase> cases = build_cases(o);
  KBN_CHECK(!cases.empty(), "kb_nano kernels: no cases selected (check --target, --model, --tokens and --case)");
  if (o.list) {
    std::printf("%s", bench::format_case_list(cases).c_str());
    return;
  }
  KBN_CHECK(cuda_available(), "kb_nano kernels times CUDA kernels; no GPU visible");
  bench::TimingOptions topts;
  topts.mode = bench::parse_timing_mode(o.mode);

  const bench::DeviceInfo dev = bench::query_device(0);
  std::fprintf(stderr, "kb_nano kernels: %s, %d SMs, L2 %lld MiB; measuring ceilings...\n", dev.name.c_str(),
               dev.sm_count, dev.l2_bytes >> 20);
  const bench::Ceilings ceil = bench::measure_ceilings();
  std::fprintf(stderr, "kb_nano kernels: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s; %zu cases, mode %s\n",
               ceil.copy_gb_per_s, ceil.bf16_tflop_per_s, cases.size(), o.mode.c_str());

  // Cases arrive grouped by (model, tp, op); one table and one progress line per group.
  std::vector<Row> rows;
  rows.reserve(cases.size());
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each group in `cases`
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool same = i > 0 && cases[i].op == cases[i - 1].op && cases[i].model == cases[i - 1].model &&
                      cases[i].tp == cases[i - 1].tp;
    if (same)
      spans.back().second = i + 1;
    else
      spans.push_back({i, i + 1});
  }
  std::vector<Group> groups;
  const auto start = std::chrono::steady_clock::now();
  for (size_t g = 0; g < spans.size(); ++g) {
    const auto& first = cases[spans[g].first];
    std::fprintf(stderr, "[%zu/%zu] %s %s tp=%lld: %zu cases (%.0f s elapsed)\n", g + 1, spans.size(), first.op.c_str(),
                 first.model.c_str(), (long long)first.tp, spans[g].second - spans[g].first,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    Group group;
    group.title = first.op + "  " + first.model + "  tp=" + std::to_string(first.tp) + "  (" + o.mode + ", " +
                  dtype_name(first.dtype) + ")";
    for (size_t i = spans[g].first; i < spans[g].second; ++i) {
      rows.push_back(run_case(cases[i], o, dev, ceil, topts));
      group.rows.push_back(&rows.back());
    }
    print_table(group);
    groups.push_back(std::move(group));
  }
  std::fprintf(stderr, "kb_nano kernels: done in %.0f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  if (!o.json.empty()) {
    nlohmann::json j;
    j["provenance"] = provenance(dev, ceil, o);
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rows) j["rows"].push_back(row_json(r, o));
    std::ofstream out(o.json);
    KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
    out << j.dump(2) << "\n";
  }
  if (!o.markdown.empty()) write_markdown(o.markdown, groups, dev, ceil, o);
}

}  // namespace

void add_kernels_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("kernels",
                                     "Time the baseline L1 ops at shapes from real model configs, "
                                     "against copy-bandwidth and bf16-GEMM ceilings measured at start-up");
  cmd->add_option("--target", o->targets, "Op to time (repeatable; default: every Llama L1 op)");
  cmd->add_option("--level", o->level, "Op level (only 1 so far)");
  cmd->add_option("--model", o->models,
                  "Model name from models/ (repeatable; 'all' = every real Llama config; "
                  "default llama-3.1-8b-instruct)");
  cmd->add_option("--tp", o->tps, "Tensor-parallel size whose per-rank shapes are timed (repeatable; default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tokens", o->tokens,
                  "Comma-separated token counts replacing the defaults (decode attention: "
                  "batch sizes)");
  cmd->add_option("--case", o->case_labels, "Only the case with this exact label (repeatable; see --list)");
  cmd->add_option("--mode", o->mode, "cold (flush L2, rotate inputs; default), hot, or graph (CUDA graph of 20 calls)");
  cmd->add_option("--dtype", o->dtype, "Activation and weight dtype: bf16 (default), f16 or f32");
  cmd->add_option("--seed", o->seed, "Seed of the inputs and weights");
  cmd->add_option("--json", o->json, "Write one row per case, with provenance and a rerun command, to this file");
  cmd->add_option("--markdown", o->markdown, "Write the tables as Markdown to this file");
  cmd->add_flag("--list", o->list, "Print the cases (op, model, tp, case, bytes, FLOPs) without timing; works on CPU");
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
