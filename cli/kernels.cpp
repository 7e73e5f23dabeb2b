// kb_nano kernels: is a candidate L1 op right (bench/validate.h), and is it faster (bench/timing.h)? Shapes
// come from real model configs plus random ones; times are set against ceilings measured at start-up.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/ceilings.h"
#include "bench/profile.h"
#include "bench/runner.h"
#include "bench/timing.h"
#include "bench/validate.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "kbn/allocator.h"
#include "kbn/cache_spec.h"
#include "kbn/format.h"
#include "kbn/module.h"
#include "kbn/registry.h"
#include "kbn/rng.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

struct Options {
  std::vector<std::string> targets;
  int level = 1;
  std::vector<std::string> models;
  std::vector<int64_t> tps;
  std::string tokens;
  std::vector<std::string> case_labels;
  std::string mode = "cold";
  std::string dtype = "bf16";
  std::string kv_cache_dtype = "auto";  // the pages of the attention ops that read a paged cache
  std::string variant = "auto";  // both when a candidate is built, else baseline
  std::string device = "auto";   // cuda when a GPU is visible, else an error pointing at --device cpu
  int random = -1;               // property-based random shapes per op (-1: 3 on the GPU, 2 on the CPU)
  int seeds = 3;
  uint64_t seed = 0;
  std::string json;
  std::string markdown;
  std::string csv;
  bool list = false;
  bool composition = true;  // L1 candidate: also run the L2/L3 ops whose code includes it
  double worker_timeout_s = 300;  // per request to the worker process
  bool in_process = false;        // the op under test in this process (kb_nano profile's ncu runs; not isolated)
  std::string secret_seed_arg;          // --secret-seed as given
  std::optional<uint64_t> secret_seed;  // drawn at random when not given; printed after the run
};

struct Row {
  const bench::BenchCase* c = nullptr;
  bench::Validation validation;
  bool validated = false;
  bench::Timing base, cand;  // cand: only when comparing
  std::string error;         // an exception while building, checking or timing the case
  std::string timed_check;   // "timed outputs" (a sampled timed call was wrong) or "worker" (it failed while timing)
  std::string after_timing;  // what that check saw
  std::string floor;         // why the time is above the roofline of its shape, if it is
  std::string streams;       // device work outside the timed stream, if any
  std::string skip;          // why the case was not run at all (it cannot fit on the device)
  double roofline_ms = 0;    // the fastest time the case's shape allows (GPU, from the ceilings measured in this run)
  std::string roofline_basis;
  double gb_per_s = 0, tflop_per_s = 0, pct_copy = 0, pct_bf16 = 0, speedup = 0;
  std::string bound;
  bool passed() const {
    return error.empty() && validated && validation.pass && after_timing.empty() && floor.empty() && streams.empty();
  }
  std::string verdict() const {
    if (!skip.empty()) return "SKIP";
    if (!error.empty()) return "ERROR";
    if (!validated) return "-";
    return passed() ? "PASS" : "FAIL";
  }
  // The check that failed first ("" when none did).
  std::string check() const {
    if (!skip.empty() || !error.empty()) return "";
    if (validated && !validation.pass) return validation.check;
    if (!after_timing.empty()) return timed_check;
    if (!floor.empty()) return "above the roofline";
    if (!streams.empty()) return "streams";
    return "";
  }
  std::string why() const {
    if (!skip.empty()) return skip;
    if (!error.empty()) return error;
    if (!validation.pass) return validation.check + ": " + validation.reason;
    if (!after_timing.empty()) return timed_check + ": " + after_timing;
    if (!floor.empty()) return "above the roofline: " + floor;
    if (!streams.empty()) return "streams: " + streams;
    return "";
  }
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

// True when a registered L4 model serves the config's architecture.
bool served(const ModelConfig& config) {
  for (const auto& a : config.architectures())
    for (const auto& e : registry(Variant::baseline).entries())
      if (std::find(e.architectures.begin(), e.architectures.end(), a) != e.architectures.end()) return true;
  return false;
}

// "all": every real config in models/ that a registered L4 model serves (the tiny-* configs are test
// fixtures, not deployments).
std::vector<std::string> expand_models(const std::vector<std::string>& requested) {
  std::vector<std::string> names = requested.empty() ? std::vector<std::string>{"llama-3.1-8b-instruct"} : requested;
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n != "all") {
      out.push_back(n);
      continue;
    }
    for (const auto& m : engine::known_models())
      if (m.rfind("tiny-", 0) != 0 && served(engine::resolve_model(m).config)) out.push_back(m);
  }
  return out;
}

Device pick_device(const Options& o) {
  if (o.device == "auto") {
    KBN_CHECK(cuda_available(),
              "kb_nano kernels: no GPU visible; pass --device cpu to validate and time the CPU ops (the harness "
              "and the candidate's CPU path; no roofline)");
    return Device::cuda(0);
  }
  const Device d = parse_device(o.device);
  KBN_CHECK(d.is_cpu() || cuda_available(), "--device: ", o.device, " requested but no GPU is visible");
  return d;
}

bool comparing(const Options& o) {
  if (o.variant == "baseline") return false;
  if (o.variant == "both" || o.variant == "candidate") {
    KBN_CHECK(candidate_built(), "--variant ", o.variant,
              ": this binary has no candidate variant (tasks/candidate/ was empty at build time; "
              "'kb_nano stubs --target OP' writes a starting point)");
    return true;
  }
  KBN_CHECK(o.variant == "auto", "--variant: expected baseline, both or candidate, got '", o.variant, "'");
  return candidate_built();
}

void check_level(const Options& o) {
  KBN_CHECK(o.level >= 1 && o.level <= 3,
            "--level: expected 1 (single kernels), 2 (blocks) or 3 (decoder layer), got ", o.level,
            "; whole models are measured by 'kb_nano eval'");
}

const char* level_name(int level) {
  return level == 1 ? "single kernels" : level == 2 ? "blocks" : level == 3 ? "decoder layers" : "models";
}

// Every --target must be a benchmarked op. An unknown one is refused with the ops of the requested --level (not
// every level's ops in one list), the levels that have benchmarked ops, and a "did you mean".
void check_targets(const Options& o) {
  std::vector<std::string> all;
  std::map<int, std::vector<std::string>> by_level;
  for (const auto& e : registry(Variant::baseline).entries())
    if (e.cases) {
      all.push_back(e.name);
      by_level[e.level].push_back(e.name);
    }
  for (const auto& t : o.targets) {
    if (std::find(all.begin(), all.end(), t) != all.end()) continue;
    const std::string near = closest(t, all);
    std::string ops, levels;
    for (const auto& op : by_level[o.level]) ops += (ops.empty() ? "" : ", ") + op;
    for (const auto& [level, names] : by_level)
      levels += (levels.empty() ? "" : ", ") + std::to_string(level) + " (" + level_name(level) + ", " +
                std::to_string(names.size()) + " ops)";
    KBN_FAIL("--target: '", t, "' is not a benchmarked op", near.empty() ? "." : "; did you mean '" + near + "'?",
             " Level ", o.level, " (", level_name(o.level), ") has: ", ops.empty() ? "(none)" : ops,
             ". Levels with benchmarked ops: ", levels, "; --level N --target ? lists level N's");
  }
}

// --target, else the benchmarked ops of --level that the model's L4 reaches.
std::vector<std::string> selected_ops(const Options& o, const ModelView& m) {
  check_level(o);
  return o.targets.empty() ? bench::model_ops(m, o.level) : o.targets;
}

bool is_l1(const std::string& op) { return registry(Variant::baseline).get(op).level == 1; }

bool comparing(const Options& o);

// The benchmarked L2/L3 ops whose candidate include closure holds a candidate file of L1 op `op`.
std::vector<std::string> blocks_including(const std::string& op) {
  std::vector<std::string> out;
  if (!candidate_built()) return out;
  const std::string header = registry(Variant::candidate).get(op).header;
  const std::string impl = header.substr(0, header.rfind('.')) + ".cu";
  const auto& files = candidate_files();
  const bool replaced = std::find(files.begin(), files.end(), header) != files.end() ||
                        std::find(files.begin(), files.end(), impl) != files.end();
  if (!replaced) return out;
  for (const auto& b : registry(Variant::candidate).entries()) {
    if ((b.level != 2 && b.level != 3) || !b.cases) continue;
    const auto closure = include_graph(Variant::candidate).closure(b.header);
    if (closure.count(header) || closure.count(impl)) out.push_back(b.name);
  }
  return out;
}

struct Selection {
  std::vector<bench::BenchCase> cases;
  std::vector<std::string> requested;  // the ops asked for (--target or the models' ops of --level)
};

Selection build_cases(const Options& o, bool small) {
  bench::CaseOptions copts;
  copts.tokens = parse_tokens(o.tokens);
  copts.dtype = parse_dtype(o.dtype);
  copts.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype, "--kv-cache-dtype");
  copts.small = small;
  const std::vector<int64_t> tps = o.tps.empty() ? std::vector<int64_t>{1} : o.tps;
  const int random = o.random >= 0 ? o.random : (small ? 2 : 3);
  Selection sel;
  std::set<std::string> requested;
  const std::vector<std::string> models = expand_models(o.models);
  for (const auto& model : models) {
    engine::ModelSpec spec = engine::resolve_model(model);
    for (int64_t tp : tps) {
      const ModelView view = bench::model_view(spec.name, spec.config, tp);
      for (const auto& op : selected_ops(o, view)) {
        requested.insert(op);
        for (auto& c : bench::cases_for(op, view, copts)) sel.cases.push_back(std::move(c));
        if (tp != tps.front() || random == 0) continue;  // random shapes once per (model, op)
        for (auto& c : bench::random_cases(op, view, random, o.seed, small, copts.dtype, copts.kv_cache_dtype)) {
          c.model = spec.name;
          sel.cases.push_back(std::move(c));
        }
      }
    }
  }
  sel.requested.assign(requested.begin(), requested.end());
  if (copts.kv_cache_dtype) {
    // An op whose cases ignore the option would be timed on 16-bit pages under an fp8 heading.
    for (const auto& c : sel.cases)
      KBN_CHECK(c.kv_cache_dtype == copts.kv_cache_dtype, "--kv-cache-dtype ", o.kv_cache_dtype, ": ", c.op,
                " does not read or write the paged KV cache; the option applies to flash_attn_decode, "
                "flash_attn_prefill and store_kvcache (pick them with --target)");
  }
  // An L1 candidate's gain must survive composition: the blocks and layer that include its file run too
  // (baseline blocks vs blocks built with the candidate), at their default step shapes.
  if (o.composition && !o.list && comparing(o) && o.case_labels.empty()) {
    std::set<std::string> blocks;
    for (const auto& op : sel.requested)
      if (is_l1(op))
        for (const auto& b : blocks_including(op)) blocks.insert(b);
    for (const auto& model : models) {
      engine::ModelSpec spec = engine::resolve_model(model);
      const ModelView view = bench::model_view(spec.name, spec.config, 1);
      if (!registry(Variant::baseline).find_model_for(view.architecture)) {
        // Its L1 ops run ahead of its model (DeepSeek-V3's router and latent decode): no block of it exists to
        // compose into.
        std::fprintf(stderr, "kb_nano kernels: %s: no L4 model serves %s yet, so no block includes the candidate; "
                     "composition skipped\n", spec.name.c_str(), view.architecture.c_str());
        continue;
      }
      bench::CaseOptions bopts;
      bopts.dtype = copts.dtype;
      bopts.small = small;
      if (small) bopts.tokens = {2, 300};
      for (int level : {2, 3})
        for (const auto& op : bench::model_ops(view, level))
          if (blocks.count(op))
            for (auto& c : bench::cases_for(op, view, bopts)) sel.cases.push_back(std::move(c));
    }
  }
  if (!o.case_labels.empty()) {
    const std::set<std::string> wanted(o.case_labels.begin(), o.case_labels.end());
    std::set<std::string> matched;
    std::vector<bench::BenchCase> kept;
    for (auto& c : sel.cases) {
      if (!wanted.count(c.label)) continue;
      matched.insert(c.label);
      kept.push_back(std::move(c));
    }
    for (const auto& w : wanted)
      KBN_CHECK(matched.count(w), "--case: no case is labelled '", w, "' (kb_nano kernels --list shows the labels)");
    sel.cases = std::move(kept);
  }
  return sel;
}

std::string rerun_command(const bench::BenchCase& c, const Options& o) {
  const bool random = c.label.rfind("random#", 0) == 0;
  std::string cmd = "kb_nano kernels --target " + c.op + " --model " + c.model + " --tp " + std::to_string(c.tp);
  if (random)
    cmd += " --random " + std::to_string(o.random >= 0 ? o.random : 3);
  else
    cmd += " --tokens " + std::to_string(c.tokens);
  if (c.kv_cache_dtype) cmd += " --kv-cache-dtype " + o.kv_cache_dtype;
  cmd += " --mode " + o.mode + " --seed " + std::to_string(o.seed) + " --secret-seed " +
         std::to_string(o.secret_seed.value_or(0)) + " --dtype " + dtype_name(c.dtype) + " --variant " + o.variant +
         " --device " + o.device + " --case " + bench::shell_join({c.label});
  return cmd;
}

// The roofline of the faster-measured variant of interest: the candidate's when comparing.
void fill_roofline(Row& r, const bench::Timing& t, const bench::Ceilings& ceil) {
  if (!t.ok || t.median_ms <= 0 || ceil.copy_gb_per_s <= 0) return;
  const double seconds = t.median_ms * 1e-3;
  r.gb_per_s = double(r.c->bytes) / seconds / 1e9;
  r.tflop_per_s = double(r.c->flops) / seconds / 1e12;
  r.pct_copy = 100.0 * r.gb_per_s / ceil.copy_gb_per_s;
  r.pct_bf16 = 100.0 * r.tflop_per_s / ceil.bf16_tflop_per_s;
  const double memory_floor = double(r.c->bytes) / (ceil.copy_gb_per_s * 1e9);
  const double compute_floor = double(r.c->flops) / (ceil.bf16_tflop_per_s * 1e12);
  r.bound = memory_floor > compute_floor ? "memory" : "compute";
}

struct Context {
  Device device;
  bool compare = false;
  bool small = false;  // CPU-sized cases
  bench::DeviceInfo dev;
  bench::Ceilings ceil;
  bench::TimingOptions topts;
  bench::ValidationOptions vopts;
  uint64_t secret = 0;       // the run's secret seed (printed after the run)
  uint64_t input_seed = 0;   // --seed mixed with the secret: every input value the candidate sees
  uint64_t weight_seed = 0;  // --seed mixed with the secret: the op's weights
  std::unique_ptr<bench::WorkerRunner> worker;
  std::map<std::string, bench::GemmCeiling> gemm_ceilings;  // per GEMM shape, measured once per run
};

// Input sets one timed case holds at once: cold mode rotates sets totalling > 3x L2; graph mode one per captured
// call where 4 GiB allow (each set is refreshed once per launch); hot mode two.
int timing_input_sets(const bench::BenchCase& c, const Context& ctx) {
  if (!ctx.device.is_cuda()) return 2;
  if (ctx.topts.mode == bench::TimingMode::cold)
    return std::max(2, bench::cold_input_sets(c.input_bytes, ctx.dev.l2_bytes));
  if (ctx.topts.mode == bench::TimingMode::graph) {
    const long long fit = c.input_bytes > 0 ? (4LL << 30) / c.input_bytes : ctx.topts.graph_calls;
    return int(std::clamp<long long>(fit, 2, ctx.topts.graph_calls));
  }
  return 2;
}

// The roofline of the case's shape in this run: the fastest time the ceilings measured in this run allow. Memory:
// the bytes at the faster of the copy and read rates (cold mode only: hot inputs sit in L2). Compute: for a case that
// is one GEMM and compute-bound, the fastest run of any cuBLASLt algorithm on that very shape (measured here, in the
// same mode); for anything else the FLOPs at the 8192^3 GEMM rate. A time the baseline itself reached in this run is
// achievable by definition, so the roofline is never above the baseline's fastest run.
void fill_roofline_floor(Row& r, const bench::Timing& base, Context& ctx) {
  const bench::BenchCase& c = *r.c;
  const bool cold = ctx.topts.mode == bench::TimingMode::cold;
  const double mem_rate = std::max(ctx.ceil.copy_gb_per_s, ctx.ceil.read_gb_per_s) * 1e9;
  const double memory_ms = cold && mem_rate > 0 ? double(c.bytes) / mem_rate * 1e3 : 0.0;
  double compute_ms = ctx.ceil.bf16_tflop_per_s > 0 ? double(c.flops) / (ctx.ceil.bf16_tflop_per_s * 1e12) * 1e3 : 0;
  std::string basis = "FLOPs at the 8192^3 GEMM rate " + fmt("%.0f", ctx.ceil.bf16_tflop_per_s) + " TFLOP/s";
  if (c.gemm && compute_ms >= memory_ms) {
    const auto [m, n, k] = *c.gemm;
    const std::string key = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                            dtype_name(c.dtype) + (cold ? " cold" : " hot");
    auto it = ctx.gemm_ceilings.find(key);
    if (it == ctx.gemm_ceilings.end())
      it = ctx.gemm_ceilings.emplace(key, bench::measure_gemm_ceiling(m, n, k, c.dtype, cold)).first;
    if (it->second.ms > 0) {
      compute_ms = it->second.ms;
      basis = "the fastest of " + std::to_string(it->second.algorithms) + " cuBLASLt algorithms on " + key + " (" +
              fmt("%.2f", it->second.ms * 1e3) + " us)";
    }
  }
  r.roofline_ms = std::max(memory_ms, compute_ms);
  if (memory_ms > compute_ms)
    basis = std::to_string(c.bytes) + " bytes at " + fmt("%.0f", mem_rate / 1e9) + " GB/s (the faster of copy and read)";
  if (base.ok && base.min_ms > 0 && base.min_ms < r.roofline_ms) {
    r.roofline_ms = base.min_ms;
    basis = "the baseline's fastest run in this case (" + basis + " is slower)";
  }
  r.roofline_basis = basis;
  const bench::Timing& t = ctx.compare ? r.cand : r.base;
  if (!t.ok || r.roofline_ms <= 0 || t.median_ms >= r.roofline_ms) return;
  r.floor = "median " + fmt("%.2f", t.median_ms * 1e3) + " us is " + fmt("%.1f", 100.0 * r.roofline_ms / t.median_ms) +
            "% of the roofline of this shape, " + fmt("%.2f", r.roofline_ms * 1e3) + " us (" + basis +
            "): faster than the hardware allows, so the work was not all done in the timed call";
}

bench::CaseKey case_key(const bench::BenchCase& c, const Options& o, bool small) {
  bench::CaseKey k;
  k.op = c.op;
  k.model = c.model;
  k.label = c.label;
  k.tp = c.tp;
  k.tokens = c.tokens;
  k.random = c.label.rfind("random#", 0) == 0;
  k.random_count = o.random >= 0 ? o.random : (small ? 2 : 3);
  k.shape_seed = o.seed;
  k.small = small;
  k.dtype = c.dtype;
  k.kv_cache_dtype = c.kv_cache_dtype;
  return k;
}

// Samples of the timed calls verified per case: all outputs of up to 16 calls, fewer for large outputs (~512 MiB).
int timed_samples(const bench::BenchCase& c) {
  const double out_bytes = std::max(1.0, double(c.output_numel) * double(dtype_size(c.dtype)));
  return int(std::clamp(double(512 << 20) / out_bytes, 1.0, 16.0));
}

Row run_case(const bench::BenchCase& c, const Options& o, Context& ctx) {
  Row r;
  r.c = &c;
  const int sets = timing_input_sets(c, ctx);
  if (ctx.device.is_cuda()) {
    r.skip = bench::case_does_not_fit(c.input_bytes, sets, ctx.dev.memory_bytes);
    if (!r.skip.empty()) return r;
  }
  try {
    // NOTE: a dedicated non-blocking stream: the legacy default stream would implicitly wait for work a
    // candidate hides on another (blocking) stream, and the validation could no longer see it.
    OwnedStream stream(ctx.device);
    StreamGuard guard(stream.get());
    const OpEntry& be = registry(Variant::baseline).get(c.op);
    std::unique_ptr<AnyOp> base = bench::build_case_op(be, c, ctx.device, ctx.weight_seed);
    std::unique_ptr<AnyOp> oracle;
    if (bench::fits_cpu_oracle(c)) oracle = bench::build_case_op(be, c, Device::cpu(), ctx.weight_seed);
    // The op under test lives in the worker process; without a candidate it is a second instance of the baseline,
    // which must meet the same contract. (--in-process keeps it here, for kb_nano profile's ncu runs.)
    const Variant tested = ctx.compare ? Variant::candidate : Variant::baseline;
    std::unique_ptr<AnyOp> local_op;
    std::unique_ptr<bench::InProcessRunner> local;
    std::string opened;
    if (o.in_process) {
      const OpEntry& te = registry(tested).get(c.op);
      local_op = bench::build_case_op(te, c, ctx.device, ctx.weight_seed);
      local = std::make_unique<bench::InProcessRunner>(c, te, *local_op, ctx.device);
      (void)take_guard_violations();
    } else {
      opened = ctx.worker->open(case_key(c, o, ctx.small), tested, ctx.weight_seed, ctx.device);
    }
    bench::CandidateRunner& under_test = o.in_process ? static_cast<bench::CandidateRunner&>(*local) : *ctx.worker;
    r.validated = true;
    if (!opened.empty()) {
      r.validation.pass = false;
      r.validation.check = "worker";
      r.validation.reason = opened;
    } else {
      r.validation =
          bench::validate_candidate(c, be, *base, under_test, oracle.get(), ctx.device, ctx.input_seed, ctx.vopts);
    }
    if (!r.validation.pass) {
      r.base.skipped = r.cand.skipped = "not timed: validation failed";
    } else {
      // Every timed call runs on values written into its input set just before it (bench/timing.h); the
      // baseline's and the candidate's values come from different seeds. The trusted baseline is timed here, the
      // same way, without samples.
      bench::TimingRequest req;
      req.options = ctx.topts;
      req.input_sets = sets;
      req.capturable = c.graph_capturable;
      req.value_seed = hash_seed(ctx.input_seed, "timing.baseline");
      req.max_samples = 0;
      const bench::Timing parent = bench::InProcessRunner(c, be, *base, ctx.device).time(req).timing;
      req.value_seed = hash_seed(ctx.input_seed, "timing.candidate");
      req.max_samples = timed_samples(c);
      req.sample_seed = hash_seed(ctx.secret, ("samples " + c.op + " " + c.label).c_str());
      const bench::TimingResult tr = under_test.time(req);
      // Comparing: the parent's baseline against the worker's candidate. Baseline only: the worker's second
      // instance is the one validated, and its time is reported.
      r.base = ctx.compare ? parent : tr.timing;
      if (ctx.compare) r.cand = tr.timing;
      if (tr.failed()) {
        r.timed_check = tr.check;
        r.after_timing = tr.reason;
      } else {
        const std::string wrong = bench::verify_timed_samples(c, be, *base, tr.samples, ctx.device, oracle.get());
        if (!wrong.empty()) {
          r.timed_check = "timed outputs";
          r.after_timing = wrong;
        }
      }
      const bench::Timing& t = ctx.compare ? r.cand : r.base;
      // Work that escapes the timed stream is not in the time: such a result is not a measurement. The bound is
      // the empty iteration's round trip measured in the same run (and 10% of the call).
      if (t.ok && t.outside_stream_ms > std::max(t.empty_round_trip_ms, 0.1 * t.median_ms)) {
        char buf[240];
        std::snprintf(buf, sizeof buf,
                      "about %.1f us of device work per call ran after the timed stream's end (another stream or "
                      "thread the caller's stream never waits for); the %.1f us measured leave it out",
                      t.outside_stream_ms * 1e3, t.median_ms * 1e3);
        r.streams = buf;
      }
      fill_roofline(r, t, ctx.ceil);
      if (ctx.device.is_cuda()) fill_roofline_floor(r, parent, ctx);
      if (ctx.compare && r.base.ok && r.cand.ok && r.cand.median_ms > 0)
        r.speedup = r.base.median_ms / r.cand.median_ms;
    }
    const std::string closed = o.in_process ? "" : ctx.worker->close();
    if (!closed.empty() && r.validation.pass && r.after_timing.empty()) {
      r.timed_check = "worker";
      r.after_timing = closed;
    }
  } catch (const Error& e) {
    r.error = e.what();
  }
  if (ctx.device.is_cuda()) cuda_empty_cache();  // each case starts from an empty cache
  return r;
}

struct Group {
  std::string title;
  std::vector<const Row*> rows;
};

std::string us(const bench::Timing& t) { return t.ok ? fmt("%.2f", t.median_ms * 1e3) : "-"; }

std::vector<std::string> headers(bool compare) {
  if (compare)
    return {"case", "check", "base us", "cand us", "speedup", "GB/s", "TFLOP/s", "% copy BW", "% bf16", "bound", "why"};
  return {"case", "check", "median us", "p10-p90 us", "GB/s", "TFLOP/s", "% copy BW", "% bf16", "bound", "why"};
}

std::vector<std::string> row_cells(const Row& r, bool compare, bool roofline) {
  auto num = [&](const char* f, double v) { return roofline && v > 0 ? fmt(f, v) : std::string("-"); };
  const bench::Timing& t = compare ? r.cand : r.base;
  std::vector<std::string> cells = {r.c->label, r.verdict()};
  if (compare) {
    cells.push_back(us(r.base));
    cells.push_back(us(r.cand));
    cells.push_back(r.speedup > 0 ? fmt("%.3fx", r.speedup) : "-");
  } else {
    cells.push_back(us(t));
    cells.push_back(t.ok ? fmt("%.2f", t.p10_ms * 1e3) + "-" + fmt("%.2f", t.p90_ms * 1e3) : "-");
  }
  cells.push_back(num("%.1f", r.gb_per_s));
  cells.push_back(num("%.2f", r.tflop_per_s));
  cells.push_back(num("%.1f", r.pct_copy));
  cells.push_back(num("%.1f", r.pct_bf16));
  cells.push_back(roofline && !r.bound.empty() ? r.bound : "-");
  cells.push_back(r.why());
  return cells;
}

void print_table(const Group& g, bool compare, bool roofline) {
  std::printf("\n%s\n", g.title.c_str());
  const auto h = headers(compare);
  std::vector<std::vector<std::string>> lines{h};
  for (const Row* r : g.rows) lines.push_back(row_cells(*r, compare, roofline));
  std::vector<size_t> width(h.size(), 0);
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

struct Summary {
  int cases = 0, passed = 0, failed = 0, errors = 0, skipped = 0;
  double geomean_speedup = 0;              // over passing rows of the requested ops with both times (0: none)
  double composition_geomean_speedup = 0;  // over passing rows of the blocks run for composition
};

Summary summarise(const std::vector<Row>& rows, const std::vector<std::string>& requested) {
  Summary s;
  double log_sum = 0, comp_log_sum = 0;
  int n = 0, comp_n = 0;
  for (const auto& r : rows) {
    const bool composition = std::find(requested.begin(), requested.end(), r.c->op) == requested.end();
    if (composition && r.passed() && r.speedup > 0) {
      comp_log_sum += std::log(r.speedup);
      comp_n++;
    }
    s.cases++;
    if (!r.skip.empty())
      s.skipped++;
    else if (!r.error.empty())
      s.errors++;
    else if (r.passed())
      s.passed++;
    else
      s.failed++;
    if (!composition && r.passed() && r.speedup > 0) {
      log_sum += std::log(r.speedup);
      n++;
    }
  }
  if (n) s.geomean_speedup = std::exp(log_sum / n);
  if (comp_n) s.composition_geomean_speedup = std::exp(comp_log_sum / comp_n);
  return s;
}

nlohmann::json provenance(const Context& ctx, const Options& o) {
  const BuildInfo& b = build_info();
  nlohmann::json p;
  p["commit"] = b.git_commit;
  p["build_type"] = b.build_type;
  p["cuda_version"] = b.cuda_version;
  p["gencode"] = b.cuda_flags;
  p["candidate_files"] = candidate_files();
  if (ctx.device.is_cuda()) {
    const auto& dev = ctx.dev;
    p["device"] = {{"index", dev.index},
                   {"name", dev.name},
                   {"sm_count", dev.sm_count},
                   {"l2_bytes", dev.l2_bytes},
                   {"memory_bytes", dev.memory_bytes},
                   {"clock_khz", dev.clock_khz},
                   {"memory_clock_khz", dev.memory_clock_khz},
                   {"driver_version", dev.driver_version},
                   {"runtime_version", dev.runtime_version}};
    p["ceilings"] = {{"copy_gb_per_s", ctx.ceil.copy_gb_per_s},
                     {"read_gb_per_s", ctx.ceil.read_gb_per_s},
                     {"bf16_tflop_per_s", ctx.ceil.bf16_tflop_per_s}};
  } else {
    p["device"] = {{"name", "cpu"}};
  }
  p["date"] = utc_now();
  p["mode"] = o.mode;
  p["seed"] = o.seed;
  p["secret_seed"] = ctx.secret;
  p["validation_seeds"] = o.seeds;
  p["isolation"] = o.in_process ? "none: --in-process (kb_nano profile's runs)"
                                 : "the op under test ran in worker processes of this binary";
  p["workers_started"] = ctx.worker ? ctx.worker->started() : 0;
  p["variant"] = ctx.compare ? "both" : "baseline";
  return p;
}

nlohmann::json timing_json(const bench::Timing& t) {
  nlohmann::json j;
  j["timed"] = t.ok;
  if (!t.ok) {
    j["skipped"] = t.skipped;
    return j;
  }
  j["median_ms"] = t.median_ms;
  j["p10_ms"] = t.p10_ms;
  j["p90_ms"] = t.p90_ms;
  j["host_wall_median_ms"] = t.host_wall_median_ms;
  j["outside_stream_ms"] = t.outside_stream_ms;
  j["iterations"] = t.iterations;
  j["input_sets"] = t.input_sets;
  return j;
}

nlohmann::json row_json(const Row& r, const Options& o, bool compare) {
  const auto& c = *r.c;
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
  j["verdict"] = r.verdict();
  j["check"] = r.check();
  j["reason"] = r.why();
  j["validation"] = {{"pass", r.validation.pass},
                     {"check", r.validation.check},
                     {"reason", r.validation.reason},
                     {"runs", r.validation.runs},
                     {"oracle_runs", r.validation.oracle_runs},
                     {"routing_tie_rows_exempt", r.validation.routing_tie_rows},
                     {"routing_tie_comparisons", r.validation.routing_tie_comparisons},
                     {"worst_mean_rel_err_vs_baseline", r.validation.worst_mean_rel_err}};
  j["baseline"] = timing_json(r.base);
  if (compare) {
    j["candidate"] = timing_json(r.cand);
    j["speedup"] = r.speedup;
  }
  if (r.gb_per_s > 0) {
    j["gb_per_s"] = r.gb_per_s;
    j["tflop_per_s"] = r.tflop_per_s;
    j["pct_copy_bandwidth"] = r.pct_copy;
    j["pct_bf16_rate"] = r.pct_bf16;
    j["bound"] = r.bound;
  }
  if (r.roofline_ms > 0) {
    j["roofline_us"] = r.roofline_ms * 1e3;
    j["roofline_basis"] = r.roofline_basis;
    const bench::Timing& t = compare ? r.cand : r.base;
    if (t.ok && t.median_ms > 0) j["pct_roofline"] = 100.0 * r.roofline_ms / t.median_ms;
  }
  if (!r.error.empty()) j["error"] = r.error;
  if (!c.note.empty()) j["note"] = c.note;
  j["rerun"] = rerun_command(c, o);
  return j;
}

// The rows as CSV, one line per case: the fields of --json that a spreadsheet needs, times in microseconds, and the
// rerun command. Empty fields where a row has no value (no candidate, untimed, CPU).
void write_csv(const std::string& path, const std::vector<Row>& rows, const Options& o, bool compare) {
  std::ofstream out(path);
  KBN_CHECK(out.good(), "--csv: cannot write '", path, "'");
  std::vector<std::string> head = {"op", "model", "tp", "case", "tokens", "dtype", "mode", "verdict", "check",
                                   "baseline_median_us", "baseline_p10_us", "baseline_p90_us"};
  if (compare) head.insert(head.end(), {"candidate_median_us", "candidate_p10_us", "candidate_p90_us", "speedup"});
  head.insert(head.end(), {"gb_per_s", "tflop_per_s", "pct_copy_bandwidth", "pct_bf16_rate", "bound", "roofline_us",
                           "bytes", "flops", "why", "rerun"});
  out << csv_line(head);
  auto num = [](double v) { return fmt("%.6g", v); };
  auto times = [&](const bench::Timing& t) -> std::vector<std::string> {
    if (!t.ok) return {"", "", ""};
    return {num(t.median_ms * 1e3), num(t.p10_ms * 1e3), num(t.p90_ms * 1e3)};
  };
  for (const Row& r : rows) {
    const auto& c = *r.c;
    std::vector<std::string> f = {c.op, c.model, std::to_string(c.tp), c.label, std::to_string(c.tokens),
                                  dtype_name(c.dtype), o.mode, r.verdict(), r.check()};
    for (auto& x : times(r.base)) f.push_back(x);
    if (compare) {
      for (auto& x : times(r.cand)) f.push_back(x);
      f.push_back(r.speedup > 0 ? num(r.speedup) : "");
    }
    const bool rated = r.gb_per_s > 0;
    f.push_back(rated ? num(r.gb_per_s) : "");
    f.push_back(rated ? num(r.tflop_per_s) : "");
    f.push_back(rated ? num(r.pct_copy) : "");
    f.push_back(rated ? num(r.pct_bf16) : "");
    f.push_back(rated ? r.bound : "");
    f.push_back(r.roofline_ms > 0 ? num(r.roofline_ms * 1e3) : "");
    f.push_back(num(double(c.bytes)));
    f.push_back(num(double(c.flops)));
    f.push_back(r.why());
    f.push_back(rerun_command(c, o));
    out << csv_line(f);
  }
}

void write_markdown(const std::string& path, const std::vector<Group>& groups, const Context& ctx, const Options& o,
                    const Summary& sum) {
  std::ofstream md(path);
  KBN_CHECK(md.good(), "--markdown: cannot write '", path, "'");
  const BuildInfo& b = build_info();
  md << "# kb_nano kernels (" << o.mode << ", seed " << o.seed << ", "
     << (ctx.compare ? "baseline vs candidate" : "baseline") << ")\n\n";
  if (ctx.device.is_cuda()) {
    const auto& dev = ctx.dev;
    md << dev.name << ", " << dev.sm_count << " SMs, L2 " << (dev.l2_bytes >> 20) << " MiB, driver "
       << dev.driver_version << "; commit " << b.git_commit << " (" << b.build_type << ", CUDA " << b.cuda_version
       << "); " << utc_now() << "\n\nCeilings measured at start-up: copy " << fmt("%.0f", ctx.ceil.copy_gb_per_s)
       << " GB/s, bf16 GEMM " << fmt("%.0f", ctx.ceil.bf16_tflop_per_s) << " TFLOP/s.\n";
  } else {
    md << "CPU ops (host timing, no roofline); commit " << b.git_commit << "; " << utc_now() << "\n";
  }
  md << "\n"
     << sum.passed << " of " << sum.cases << " cases pass, " << sum.failed << " fail, " << sum.errors << " errors";
  if (sum.geomean_speedup > 0)
    md << "; geometric-mean speedup over passing cases " << fmt("%.3f", sum.geomean_speedup) << "x";
  md << ".\n";
  // The console's columns, then the command that reruns the case alone (its seeds included).
  auto h = headers(ctx.compare);
  h.push_back("rerun");
  for (const auto& g : groups) {
    md << "\n## " << g.title << "\n\n|";
    for (const auto& x : h) md << " " << x << " |";
    md << "\n|";
    for (size_t i = 0; i < h.size(); ++i) md << " --- |";
    md << "\n";
    for (const Row* r : g.rows) {
      md << "|";
      for (const auto& cell : row_cells(*r, ctx.compare, ctx.device.is_cuda())) md << " " << cell << " |";
      md << " `" << rerun_command(*r->c, o) << "` |\n";
    }
  }
}

// For an L1 candidate: the higher-level ops whose code includes it (the composition a user should measure
// next, end to end with `kb_nano eval`).
void print_composition(const std::vector<std::string>& ops) {
  if (!candidate_built()) return;
  std::set<std::string> headers_of_targets;
  for (const auto& op : ops) headers_of_targets.insert(registry(Variant::candidate).get(op).header);
  for (const auto& file : candidate_files()) {
    const std::string header = file.substr(0, file.rfind('.')) + ".h";
    if (!headers_of_targets.count(header)) continue;
    std::vector<std::string> above;
    for (const auto& e : registry(Variant::candidate).entries()) {
      if (e.level <= 1) continue;
      const auto closure = include_graph(Variant::candidate).closure(e.header);
      if (closure.count(file) || closure.count(header)) above.push_back(e.name + " (L" + std::to_string(e.level) + ")");
    }
    if (above.empty()) continue;
    std::string line;
    for (const auto& a : above) line += (line.empty() ? "" : ", ") + a;
    std::printf("\ntasks/candidate/%s is also inside: %s; measure the composition end to end with 'kb_nano eval'.\n",
                file.c_str(), line.c_str());
  }
}

// The worker's side of a case: the same selection `kernels` made, found again by its label.
bench::BenchCase rebuild_case(const bench::CaseKey& key) {
  const engine::ModelSpec spec = engine::resolve_model(key.model);
  const ModelView view = bench::model_view(spec.name, spec.config, key.tp);
  std::vector<bench::BenchCase> found;
  if (key.random) {
    found = bench::random_cases(key.op, view, key.random_count, key.shape_seed, key.small, key.dtype,
                                key.kv_cache_dtype);
    for (auto& c : found) c.model = spec.name;
  } else {
    bench::CaseOptions co;
    co.tokens = {key.tokens};
    co.dtype = key.dtype;
    co.kv_cache_dtype = key.kv_cache_dtype;
    co.small = key.small;
    found = bench::cases_for(key.op, view, co);
  }
  for (auto& c : found)
    if (c.label == key.label) return std::move(c);
  KBN_FAIL("kernels worker: no case of ", key.op, " on ", key.model, " (tp ", key.tp, ", tokens ", key.tokens,
           ") is labelled '", key.label, "'");
}

void run(Options o) {
  // Output paths first: a typo must not cost a whole run.
  check_output_file("--json", o.json);
  check_output_file("--markdown", o.markdown);
  check_output_file("--csv", o.csv);
  check_level(o);
  check_targets(o);
  const bool small = o.device == "cpu";
  const Selection selection = build_cases(o, small);
  const std::vector<bench::BenchCase>& cases = selection.cases;
  KBN_CHECK(!cases.empty(), "kb_nano kernels: no cases selected (check --target, --model, --tokens and --case)");
  if (o.list) {
    std::printf("%s", bench::format_case_list(cases).c_str());
    return;
  }
  Context ctx;
  ctx.device = pick_device(o);
  ctx.small = small;
  // The secret seed (GPU MODE's leaderboard keeps one too): mixed into every input and weight value the candidate
  // sees, so nothing can be precomputed for the public --seed; printed after the run, which --secret-seed repeats.
  if (!o.secret_seed_arg.empty()) {
    size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(o.secret_seed_arg, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KBN_CHECK(used == o.secret_seed_arg.size() && o.secret_seed_arg[0] != '-',
              "--secret-seed: expected a non-negative integer (as printed after a run), got '", o.secret_seed_arg, "'");
    o.secret_seed = uint64_t(v);
  }
  if (!o.secret_seed) o.secret_seed = (uint64_t(std::random_device{}()) << 32) ^ uint64_t(std::random_device{}());
  ctx.secret = *o.secret_seed;
  ctx.input_seed = hash_seed(o.seed ^ ctx.secret, "kernels.inputs");
  ctx.weight_seed = hash_seed(o.seed ^ ctx.secret, "kernels.weights");
  ctx.worker = std::make_unique<bench::WorkerRunner>(std::vector<std::string>{"/proc/self/exe", "kernels-worker"},
                                                     o.worker_timeout_s);
  ctx.compare = comparing(o);
  ctx.topts.mode = bench::parse_timing_mode(o.mode);
  KBN_CHECK(o.seeds >= 1, "--seeds: expected at least 1 validation seed, got ", o.seeds);
  ctx.vopts.seeds = o.seeds;
  if (ctx.device.is_cpu()) {
    KBN_CHECK(ctx.topts.mode != bench::TimingMode::graph, "--mode graph: CUDA graphs need --device cuda; CPU ops "
              "are timed on the host clock (use --mode cold or hot, which are the same on CPU)");
    // Host timing of CPU ops: enough iterations for a stable median, no more (CPU ops are the oracle).
    ctx.topts.host = true;
    ctx.topts.warmup_calls = 1;
    ctx.topts.min_iterations = 3;
    ctx.topts.min_measured_ms = 20;
    ctx.topts.max_iterations = 50;
    std::fprintf(stderr, "kb_nano kernels: CPU ops, %zu cases, %s\n", cases.size(),
                 ctx.compare ? "baseline vs candidate" : "baseline");
  } else {
    ctx.dev = bench::query_device(ctx.device.index);
    std::fprintf(stderr, "kb_nano kernels: %s, %d SMs, L2 %lld MiB; measuring ceilings...\n", ctx.dev.name.c_str(),
                 ctx.dev.sm_count, ctx.dev.l2_bytes >> 20);
    ctx.ceil = bench::measure_ceilings();
    std::fprintf(stderr, "kb_nano kernels: copy %.0f GB/s, read %.0f GB/s, bf16 GEMM %.0f TFLOP/s; %zu cases, mode %s, %s\n",
                 ctx.ceil.copy_gb_per_s, ctx.ceil.read_gb_per_s, ctx.ceil.bf16_tflop_per_s, cases.size(), o.mode.c_str(),
                 ctx.compare ? "baseline vs candidate" : "baseline");
  }

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
  std::set<std::string> ops;
  const auto start = std::chrono::steady_clock::now();
  for (size_t g = 0; g < spans.size(); ++g) {
    const auto& first = cases[spans[g].first];
    ops.insert(first.op);
    Group group;
    group.title = first.op + "  " + first.model + "  tp=" + std::to_string(first.tp) + "  (" + o.mode + ", " +
                  dtype_name(first.dtype) + ", " + ctx.device.str() + ")";
    for (size_t i = spans[g].first; i < spans[g].second; ++i) {
      std::fprintf(stderr, "\r[group %zu/%zu, case %zu/%zu] %s %s (%.0f s)   ", g + 1, spans.size(),
                   i - spans[g].first + 1, spans[g].second - spans[g].first, first.op.c_str(), cases[i].label.c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      rows.push_back(run_case(cases[i], o, ctx));
      group.rows.push_back(&rows.back());
    }
    std::fprintf(stderr, "\n");
    print_table(group, ctx.compare, ctx.device.is_cuda());
    groups.push_back(std::move(group));
  }
  const Summary sum = summarise(rows, selection.requested);
  std::printf("\nSummary: %d of %d cases pass, %d fail, %d errors", sum.passed, sum.cases, sum.failed, sum.errors);
  if (sum.skipped) std::printf(", %d skipped (too large for the device)", sum.skipped);
  if (sum.geomean_speedup > 0) std::printf("; geometric-mean speedup over passing cases %.3fx", sum.geomean_speedup);
  if (sum.composition_geomean_speedup > 0)
    std::printf("; in the blocks that include it %.3fx", sum.composition_geomean_speedup);
  std::printf(" (%.0f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::printf("Secret seed of this run: %llu (--secret-seed %llu repeats its inputs and weights)\n",
              (unsigned long long)ctx.secret, (unsigned long long)ctx.secret);
  if (ctx.compare) print_composition(std::vector<std::string>(ops.begin(), ops.end()));

  if (!o.json.empty()) {
    nlohmann::json j;
    j["provenance"] = provenance(ctx, o);
    j["summary"] = {{"cases", sum.cases},
                    {"passed", sum.passed},
                    {"failed", sum.failed},
                    {"errors", sum.errors},
                    {"skipped", sum.skipped},
                    {"geomean_speedup", sum.geomean_speedup},
                    {"composition_geomean_speedup", sum.composition_geomean_speedup}};
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rows) j["rows"].push_back(row_json(r, o, ctx.compare));
    std::ofstream out(o.json);
    KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
    out << j.dump(2) << "\n";
  }
  if (!o.markdown.empty()) write_markdown(o.markdown, groups, ctx, o, sum);
  if (!o.csv.empty()) write_csv(o.csv, rows, o, ctx.compare);
  // A failing candidate is a failing command: scripts and CI can rely on the exit status.
  KBN_CHECK(sum.failed == 0 && sum.errors == 0, "kb_nano kernels: ", sum.failed, " case(s) failed and ", sum.errors,
            " errored (see the 'why' column)");
}

}  // namespace

void add_kernels_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("kernels",
                                     "Validate a candidate L1 op against the baseline and the reference oracle "
                                     "(poisoned outputs, guard bytes, several seeds and value distributions, "
                                     "caching and determinism checks), then time both against ceilings measured "
                                     "at start-up");
  cmd->add_option("--target", o->targets,
                  "Op to run (repeatable; default: every op of --level that the model's L4 includes)");
  cmd->add_option("--level", o->level,
                  "1: single kernels (default), 2: blocks (parallel linears, attention and MLP blocks), "
                  "3: decoder layers; whole models are measured by 'kb_nano eval'")
      ->check(integer_in(1, 3, "1 (single kernels), 2 (blocks) or 3 (decoder layers); whole models are measured by "
                               "'kb_nano eval'"));
  cmd->add_option("--model", o->models,
                  "Model name from models/ (repeatable; 'all' = every real config a registered model serves; "
                  "default llama-3.1-8b-instruct)");
  cmd->add_option("--tp", o->tps, "Tensor-parallel size whose per-rank shapes are timed (repeatable; default 1)")
      ->check(integer_at_least(1, "a tensor-parallel size"));
  cmd->add_option("--tokens", o->tokens,
                  "Comma-separated token counts replacing the defaults (decode attention: batch sizes)");
  cmd->add_option("--random", o->random,
                  "Random property-based shapes per op (odd sizes, GQA ratios; default 3, 2 on --device cpu; 0 = none)")
      ->check(integer_at_least(0));
  cmd->add_option("--case", o->case_labels, "Only the case with this exact label (repeatable; see --list)");
  cmd->add_option("--mode", o->mode, "cold (flush L2, rotate inputs; default), hot, or graph (CUDA graph of 20 calls)");
  cmd->add_option("--dtype", o->dtype, "Activation and weight dtype: bf16 (default), f16 or f32");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "Pages of the paged-KV ops (flash_attn_decode, flash_attn_prefill, store_kvcache): auto (default: "
                  "--dtype), fp8 or fp8_e4m3, with per-tensor scales k_scale 1.25 / v_scale 0.75 as a calibrated "
                  "checkpoint's (the case's args). The oracle reads the same fp8 pages, so the 16-bit output "
                  "tolerance applies (store_kvcache: exact); what fp8 itself costs in accuracy is measured end to end "
                  "(tests/cpu/test_kv_cache_dtype.cpp)");
  cmd->add_option("--variant", o->variant,
                  "baseline, or both (baseline vs candidate); default: both when a candidate is built");
  cmd->add_option("--device", o->device, "cuda (default when a GPU is visible) or cpu (the CPU ops: harness checks)");
  cmd->add_option("--seed", o->seed, "Seed of the inputs, weights and random shapes (default 0)")->check(seed_value());
  cmd->add_option("--seeds", o->seeds, "Validation seeds per case (default 3)")->check(integer_at_least(1));
  cmd->add_option("--json", o->json, "Write one row per case, with provenance and a rerun command, to this file");
  cmd->add_option("--markdown", o->markdown, "Write the tables as Markdown to this file");
  cmd->add_option("--csv", o->csv, "Write one line per case as CSV (times in us, the rerun command) to this file");
  cmd->add_flag("!--no-composition", o->composition,
                "With an L1 candidate, do not also run the L2/L3 blocks that include it");
  cmd->add_flag("--list", o->list, "Print the cases (op, model, tp, case, bytes, FLOPs) without running them");
  cmd->add_option("--worker-timeout", o->worker_timeout_s,
                  "Seconds the op's worker process may take to answer one request before the case FAILs and the "
                  "worker is killed (default 300)")
      ->check(positive_number());
  cmd->add_option("--secret-seed", o->secret_seed_arg,
                  "The run's secret seed (default: drawn at random and printed after the run); mixed into every "
                  "input and weight the op under test sees");
  // kb_nano profile's ncu runs: the op under test in this process, where ncu's launch counting expects it. Not
  // isolated (provenance says so); hidden from --help.
  cmd->add_flag("--in-process", o->in_process, "")->group("");
  cmd->callback([o] { run(*o); });

  // The worker process the op under test runs in (bench/runner.h); started by `kernels`, not by people.
  struct WorkerOptions {
    int in_fd = -1, out_fd = -1;
  };
  auto w = std::make_shared<WorkerOptions>();
  CLI::App* worker = app.add_subcommand("kernels-worker", "");
  worker->group("");  // hidden from --help
  worker->add_option("--in-fd", w->in_fd)->required();
  worker->add_option("--out-fd", w->out_fd)->required();
  worker->callback([w] {
    const int status = bench::serve_worker(w->in_fd, w->out_fd, rebuild_case, bench::build_case_op);
    std::fflush(nullptr);
    std::_Exit(status);
  });
}

}  // namespace kbn::cli
