// kb_nano generate: greedy tokens from an L4 model (CPU or GPU), with prefill and decode timing.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/rng.h"
#include "kbn/safetensors.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

struct Options {
  std::string model;
  std::string device;
  std::string dtype;
  std::string weights;
  std::vector<std::string> prompt_ids;
  int64_t max_new_tokens = 16;
  int64_t block_size = 16;
  int tp = 1;
  uint64_t seed = 0;
  std::string variant = "baseline";
  bool stop_at_eos = false;
  bool check_finite = false;
  std::string json;
  std::string save_logits;
};

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KBN_CHECK(used == tok.size() && !tok.empty(), "--prompt-ids: expected comma-separated integers like 1,2,3, got '",
              s, "'");
    ids.push_back(v);
  }
  return ids;
}

void run(const Options& o) {
  // Output paths first: a typo must not cost a whole run.
  check_output_file("--json", o.json);
  check_output_file("--save-logits", o.save_logits);
  Device device = o.device.empty() ? engine::default_device() : parse_device(o.device);
  KBN_CHECK(!device.is_cuda() || device.index < cuda_device_count(), "--device: ", device.str(), " is not available (",
            cuda_device_count(), " CUDA devices visible)");
  engine::ModelSpec spec = engine::resolve_model(o.model.empty() ? engine::default_model_name(device) : o.model);
  if (!o.weights.empty()) spec.weights_path = o.weights;
  KBN_CHECK(o.variant == "baseline" || o.variant == "candidate", "--variant: expected baseline or candidate, got '",
            o.variant, "'");
  Variant variant = o.variant == "baseline" ? Variant::baseline : Variant::candidate;
  ParamOptions popts{o.dtype.empty() ? engine::default_dtype(spec, device) : parse_dtype(o.dtype), device};

  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : o.prompt_ids) prompts.push_back(parse_ids(p));
  if (prompts.empty()) {  // a seeded default prompt
    Tensor ids = Tensor::empty({8}, DType::i64);
    fill_randint_(ids, o.seed + 17, 0, spec.config.get_int("vocab_size"));
    prompts.push_back(ids.to_ints());
  }
  // Every position a prompt and its new tokens take must be one the model has (its rotary table ends there): checked
  // here, before the model is built, rather than found by an op mid-run.
  const int64_t max_pos = spec.config.get_int("max_position_embeddings");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t len = int64_t(prompts[i].size());
    KBN_CHECK(len + o.max_new_tokens <= max_pos, "--max-new-tokens: prompt ", i, " (", len, " tokens) + ",
              o.max_new_tokens, " new tokens = ", len + o.max_new_tokens, " positions, beyond ", spec.name,
              "'s limit of ", max_pos, " (max_position_embeddings in ", spec.config_path, "); at most ",
              std::max<int64_t>(max_pos - len, 0), " new tokens fit after this prompt",
              len >= max_pos ? " (the prompt alone is too long)" : "");
  }

  std::fprintf(
      stderr, "kb_nano generate: %s (%s) on %s%s, %s, %s weights, %s variant\n", spec.name.c_str(),
      spec.config_path.c_str(), device.str().c_str(),
      o.tp > 1 ? (", tensor parallel " + std::to_string(o.tp) + (device.is_cpu() ? " (CPU ranks)" : " (cuda:0..)"))
                     .c_str()
               : "",
      dtype_name(popts.dtype),
      spec.weights_path.empty() ? ("random (seed " + std::to_string(o.seed) + ")").c_str() : spec.weights_path.c_str(),
      o.variant.c_str());
  engine::GenerateOptions gopts;
  gopts.max_new_tokens = o.max_new_tokens;
  gopts.block_size = o.block_size;
  if (o.stop_at_eos) gopts.eos_token_ids = spec.config.get_int_list("eos_token_id");
  gopts.return_prompt_logits = !o.save_logits.empty();
  gopts.check_finite = o.check_finite;
  engine::GenerateResult r;
  if (o.tp == 1) {
    auto model = engine::build_model(spec, variant, popts, o.seed);
    r = engine::greedy_generate(*model, prompts, device, variant, gopts);
  } else {
    if (spec.weights_path.empty())
      std::fprintf(stderr, "  note: random weights are drawn per shard, so --tp %d is a different random model from "
                   "--tp 1 (a checkpoint gives the same model at every --tp)\n", o.tp);
    engine::TensorParallelGroup group(o.tp, device);
    const auto models = engine::build_model_shards(spec, variant, popts, o.seed, group);
    std::vector<engine::GenerateResult> results(static_cast<size_t>(o.tp));
    group.run([&](int rank) {
      results[size_t(rank)] = engine::greedy_generate(*models[size_t(rank)], prompts, group.device_of(rank), variant,
                                                      gopts);
    });
    for (int rank = 1; rank < o.tp; ++rank)
      KBN_CHECK(results[size_t(rank)].tokens == results[0].tokens, "--tp ", o.tp, ": rank ", rank,
                " generated other tokens than rank 0 (the ranks' logits must be identical after the gather)");
    r = std::move(results[0]);
  }

  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += int64_t(p.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::cout << "prompt " << i << " (" << prompts[i].size() << " tokens) -> ";
    for (size_t j = 0; j < r.tokens[i].size(); ++j) std::cout << (j ? "," : "") << r.tokens[i][j];
    std::cout << "\n";
  }
  double ms_per_step = r.decode_steps ? 1e3 * r.decode_seconds / double(r.decode_steps) : 0.0;
  std::printf("prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld steps, %.3f ms/step\n",
              (long long)prompt_tokens, r.prefill_seconds, double(prompt_tokens) / r.prefill_seconds,
              (long long)r.decode_steps, ms_per_step);

  if (!o.save_logits.empty()) {
    std::vector<std::pair<std::string, Tensor>> ts;
    for (size_t i = 0; i < r.prompt_logits.size(); ++i)
      ts.emplace_back("prompt_logits." + std::to_string(i), r.prompt_logits[i]);
    save_safetensors(o.save_logits, ts);
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["model"] = spec.name;
    j["device"] = device.str();
    j["dtype"] = dtype_name(popts.dtype);
    j["weights"] = spec.weights_path.empty() ? "random" : spec.weights_path;
    j["seed"] = o.seed;
    j["variant"] = o.variant;
    j["tp"] = o.tp;
    j["prompts"] = prompts;
    j["tokens"] = r.tokens;
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    j["decode_steps"] = r.decode_steps;
    j["commit"] = build_info().git_commit;
    std::ofstream out(o.json);
    out << j.dump(2) << "\n";
    KBN_CHECK(out.good(), "--json: cannot write '", o.json, "'");
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate",
                                     "Greedy tokens from an L4 model (default: the embedded model "
                                     "for this machine)");
  cmd->add_option("--model", o->model,
                  "Model name from models/, a config.json, or a local HF folder "
                  "(default: tiny-llama on CPU, llama-3.1-8b-instruct on GPU)");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda:0 when a GPU is present)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: f32 on CPU, the config's dtype on GPU)");
  cmd->add_option("--weights", o->weights, "HF folder or .safetensors file (default: seeded random weights)");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated token ids; repeat for a batch");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate per prompt")
      ->check(integer_at_least(1));
  cmd->add_option("--block-size", o->block_size, "KV cache block size")->check(integer_at_least(1));
  cmd->add_option("--tp", o->tp,
                  "Tensor-parallel size: one thread per rank, rank r on cuda:r (NCCL) or, with --device cpu, on the "
                  "CPU (default 1)")
      ->check(integer_at_least(1, "a tensor-parallel size"));
  cmd->add_option("--seed", o->seed, "Seed for random weights and the default prompt (default 0)")->check(seed_value());
  cmd->add_option("--variant", o->variant, "baseline or candidate");
  cmd->add_flag("--stop-at-eos", o->stop_at_eos, "Stop a sequence at the config's eos_token_id");
  cmd->add_flag("--check-finite", o->check_finite,
                "Check every step's logits for NaN/Inf and on the first failure name the first layer whose output "
                "was not finite (from the KV cache each layer wrote; one device-to-host copy of the logits per step)");
  cmd->add_option("--json", o->json, "Write tokens and timings to this JSON file");
  cmd->add_option("--save-logits", o->save_logits,
                  "Write every prompt position's logits (f32) to this .safetensors file, as prompt_logits.<i>");
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
