// kb_nano bench: llama-bench's tests on the engine. pp<N>: one prompt of N tokens prefilled in one step (tokens/s
// = N / time to the first token); tg<N>: N tokens generated one at a time after a one-token prompt (tokens/s = N /
// the time from the first sampled token to the last). Each test repeated -r times after a warm-up run, reported as
// mean +- sample standard deviation of tokens/s, as llama-bench reports it, in markdown, CSV or JSON (-o).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/workloads.h"
#include "kbn/device.h"
#include "kbn/error.h"
#include "kbn/format.h"
#include "kbn/registry.h"
#include "kbn/rng.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

struct Options {
  std::string model;
  std::string device;
  std::string dtype;
  std::string weights;
  std::string mode;  // empty: graph on CUDA, eager on CPU
  std::string variant = "baseline";
  std::string prompts = "512";
  std::string gens = "128";
  int repetitions = 5;
  uint64_t seed = 0;
  std::string output = "md";
};

// "512,4096" -> {512, 4096}; 0 entries are dropped (llama-bench: -p 0 runs no prompt test). Errors name the flag.
std::vector<int64_t> parse_lengths(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
    KBN_CHECK(!item.empty() && end == item.c_str() + item.size() && v >= 0, flag,
              ": expected comma-separated token counts >= 0, got '", s, "'");
    if (v > 0) out.push_back(v);
  }
  return out;
}

struct TestResult {
  std::string test;  // "pp512", "tg128"
  int64_t tokens = 0;
  std::vector<double> samples;  // tokens/s per repetition
  double mean = 0, stddev = 0;
};

void summarise(TestResult& r) {
  const double n = double(r.samples.size());
  for (double v : r.samples) r.mean += v / n;
  double ss = 0;
  for (double v : r.samples) ss += (v - r.mean) * (v - r.mean);
  r.stddev = r.samples.size() > 1 ? std::sqrt(ss / (n - 1)) : 0;
}

int run_bench(const Options& o) {
  const Device device = resolve_device(o.device);
  const std::vector<int64_t> pp = parse_lengths("-p", o.prompts), tg = parse_lengths("-n", o.gens);
  KBN_CHECK(!pp.empty() || !tg.empty(), "-p and -n: every length is 0, so there is no test to run");
  const std::string mode_name = o.mode.empty() ? (device.is_cuda() ? "graph" : "eager") : o.mode;
  const engine::ExecutionMode mode = engine::parse_execution_mode(mode_name);
  KBN_CHECK(mode == engine::ExecutionMode::eager || device.is_cuda(),
            "--mode graph: CUDA graphs need a CUDA device; got ", device.str(), " (use --mode eager)");
  const Variant variant = o.variant == "candidate" ? Variant::candidate : Variant::baseline;
  KBN_CHECK(variant == Variant::baseline || candidate_built(), "--variant candidate: no candidate is compiled into "
            "this binary (tasks/candidate/ held no task files at build time)");

  const engine::ModelSpec spec = resolve_model_spec(o.model, o.weights, device);
  DType dtype = engine::default_dtype(spec, device);
  if (!o.dtype.empty()) dtype = parse_dtype(o.dtype);
  KBN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
            "--dtype: expected f32, bf16 or f16, got '", o.dtype, "'");
  const int64_t max_pos = engine::max_positions(spec);
  const int64_t vocab = spec.config.get_int("vocab_size");
  int64_t longest = 2;
  for (int64_t p : pp) longest = std::max(longest, p + 1);
  for (int64_t n : tg) longest = std::max(longest, n + 2);
  KBN_CHECK(longest <= max_pos, "-p/-n: a test needs ", longest, " positions, beyond ", spec.name, "'s ",
            max_pos, " (max_position_embeddings)");

  engine::EngineConfig cfg;
  cfg.max_model_len = longest;
  cfg.max_num_seqs = 1;  // one sequence at a time, as llama-bench's tests
  cfg.max_num_batched_tokens = std::max<int64_t>(longest, 2048);  // a pp test's prompt is one step
  cfg.mode = mode;
  cfg.enable_prefix_caching = false;  // repetitions must compute their prompts
  auto model = engine::build_model(spec, variant, {dtype, device}, o.seed);
  int64_t params = 0;
  // The weights, as llama-bench counts them: optional parameters (fp8 KV-cache scales) are not weights.
  for (const auto& [name, p] : model->named_parameters())
    if (!p.optional) params += p.tensor->numel();
  engine::LLMEngine eng(*model, variant, device, cfg);

  std::vector<TestResult> results;
  int64_t next_id = 0;
  // One request of vLLM's random workload (exact lengths), its seed advanced per run so every prompt differs.
  auto run_one = [&](int64_t prompt_len, int64_t max_tokens) {
    engine::WorkloadOptions wo;
    wo.seed = hash_seed(o.seed, ("bench.run." + std::to_string(next_id)).c_str());
    wo.vocab_size = vocab;
    wo.max_model_len = longest;
    engine::Workload w = engine::make_workload(engine::random_workload_spec(prompt_len, max_tokens, 1, 0), wo);
    w.requests.at(0).id = next_id++;
    return eng.run_to_completion(w.requests).outputs.at(0);
  };
  for (int64_t p : pp) {
    TestResult r{"pp" + std::to_string(p), p, {}, 0, 0};
    (void)run_one(p, 1);  // warm-up
    for (int i = 0; i < o.repetitions; ++i) {
      const engine::RequestOutput out = run_one(p, 1);
      const double s = out.token_times.at(0) - out.arrival_time;
      r.samples.push_back(double(p) / s);
    }
    summarise(r);
    results.push_back(r);
  }
  for (int64_t n : tg) {
    TestResult r{"tg" + std::to_string(n), n, {}, 0, 0};
    (void)run_one(1, n + 1);  // warm-up
    for (int i = 0; i < o.repetitions; ++i) {
      const engine::RequestOutput out = run_one(1, n + 1);
      const double s = out.token_times.back() - out.token_times.front();  // n decode steps
      r.samples.push_back(double(n) / s);
    }
    summarise(r);
    results.push_back(r);
  }

  const double size_gib = double(params) * double(dtype_size(dtype)) / double(1ull << 30);
  const std::string backend = std::string(device.is_cuda() ? "CUDA" : "CPU") + " kb-nano " + variant_name(variant) +
                              " " + mode_name;
  const BuildInfo& b = build_info();
  if (o.output == "json") {
    nlohmann::json j = {{"model", spec.name},           {"model_size_bytes", params * int64_t(dtype_size(dtype))},
                        {"model_n_params", params},     {"dtype", dtype_name(dtype)},
                        {"backend", backend},           {"device", device.str()},
                        {"repetitions", o.repetitions}, {"commit", b.git_commit},
                        {"weights", spec.weights_path.empty() ? "random (seed " + std::to_string(o.seed) + ")"
                                                              : spec.weights_path}};
    for (const auto& r : results)
      j["tests"].push_back({{"test", r.test},
                            {"n_prompt", r.test[0] == 'p' ? r.tokens : 0},
                            {"n_gen", r.test[0] == 't' ? r.tokens : 0},
                            {"avg_ts", r.mean},
                            {"stddev_ts", r.stddev},
                            {"samples_ts", r.samples}});
    std::printf("%s\n", j.dump(1).c_str());
  } else if (o.output == "csv") {
    std::printf("model,size_bytes,n_params,backend,test,n_prompt,n_gen,avg_ts,stddev_ts,commit\n");
    for (const auto& r : results)
      std::printf("%s,%lld,%lld,%s,%s,%lld,%lld,%.3f,%.3f,%s\n", csv_field(spec.name).c_str(),
                  (long long)(params * int64_t(dtype_size(dtype))), (long long)params, csv_field(backend).c_str(),
                  r.test.c_str(), (long long)(r.test[0] == 'p' ? r.tokens : 0),
                  (long long)(r.test[0] == 't' ? r.tokens : 0), r.mean, r.stddev, csv_field(b.git_commit).c_str());
  } else {
    std::printf("| model | size | params | backend | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: |\n");
    // llama-bench's units: GiB and B(illion) parameters, MiB and M for small models.
    const std::string size = size_gib >= 1 ? fmt("%.2f GiB", size_gib) : fmt("%.2f MiB", size_gib * 1024);
    const std::string count = params >= 1'000'000'000 ? fmt("%.2f B", double(params) / 1e9)
                                                      : fmt("%.2f M", double(params) / 1e6);
    for (const auto& r : results)
      std::printf("| %s %s | %s | %s | %s | %s | %.2f ± %.2f |\n", spec.name.c_str(), dtype_name(dtype), size.c_str(),
                  count.c_str(), backend.c_str(), r.test.c_str(), r.mean, r.stddev);
    std::printf("\nkb-nano %s, %s, %d repetitions after a warm-up, %s weights\n", b.git_commit.c_str(),
                device.str().c_str(), o.repetitions, spec.weights_path.empty() ? "random" : "checkpoint");
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench",
                                     "llama-bench's tests on the engine: prompt processing (-p) and token generation "
                                     "(-n) tokens/s, mean ± stddev over -r repetitions");
  cmd->add_option("--model,-m", o->model,
                  "Model name from models/, a config.json, or a local HF folder (default: tiny-llama on CPU, "
                  "llama-3.1-8b-instruct on GPU)");
  cmd->add_option("--weights", o->weights, "Checkpoint (HF folder or .safetensors); default random weights");
  cmd->add_option("--device", o->device, "cpu or cuda[:N] (default: cuda:0 when a GPU is visible)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: the config's on CUDA, f32 on CPU)");
  cmd->add_option("-p,--n-prompt", o->prompts,
                  "Prompt lengths, comma-separated: test ppN prefills one N-token prompt in one step (default 512; "
                  "0 = no prompt test)");
  cmd->add_option("-n,--n-gen", o->gens,
                  "Generation lengths, comma-separated: test tgN generates N tokens one at a time (default 128; 0 = "
                  "no generation test)");
  cmd->add_option("-r,--repetitions", o->repetitions, "Repetitions of each test after one warm-up run (default 5)")
      ->check(integer_at_least(1));
  cmd->add_option("-o,--output", o->output, "Output format on stdout: md (default), csv or json")
      ->check(one_of({"md", "csv", "json"}));
  cmd->add_option("--mode", o->mode, "eager or graph (default: graph on CUDA, eager on CPU)")
      ->check(one_of({"eager", "graph"}));
  cmd->add_option("--variant", o->variant, "baseline (default) or candidate")
      ->check(one_of({"baseline", "candidate"}));
  cmd->add_option("--seed", o->seed, "Seed of the random weights and prompts (default 0)")->check(seed_value());
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace kbn::cli
