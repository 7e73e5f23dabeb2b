// kb_nano generate: text or token ids through an L4 model (CPU or GPU), greedy or sampled, with prefill and decode
// timing.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/generate.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/rng.h"
#include "kbn/safetensors.h"
#include "kbn/version.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace kbn::cli {
namespace {

struct Options {
  std::string model;
  std::string device;
  std::string dtype;
  std::string weights;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;  // text; "-" reads stdin
  std::string tokenizer;
  bool ids = false;
  bool chat = false;
  std::string system;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  int64_t block_size = 16;
  std::string kv_cache_dtype = "auto";
  int tp = 1;
  uint64_t seed = 0;
  std::string variant = "baseline";
  bool stop_at_eos = false;
  bool check_finite = false;
  bool no_warmup = false;
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
  const Device device = resolve_device(o.device);
  const engine::ModelSpec spec = resolve_model_spec(o.model, o.weights, device);
  KBN_CHECK(o.variant == "baseline" || o.variant == "candidate", "--variant: expected baseline or candidate, got '",
            o.variant, "'");
  Variant variant = o.variant == "baseline" ? Variant::baseline : Variant::candidate;
  ParamOptions popts{o.dtype.empty() ? engine::default_dtype(spec, device) : parse_dtype(o.dtype), device};

  KBN_CHECK(o.prompts.empty() || o.prompt_ids.empty(), "--prompt and --prompt-ids: give one or the other");
  KBN_CHECK(!o.chat || !o.prompts.empty(), "--chat: needs --prompt (the user's message)");
  KBN_CHECK(o.system.empty() || o.chat, "--system: only with --chat");
  // The tokenizer: --tokenizer, else the model's own (its folder, or --weights' folder), else none.
  const std::string tok_path = resolve_tokenizer_path(o.tokenizer, o.weights, spec);
  if (!o.tokenizer.empty())
    KBN_CHECK(std::filesystem::is_regular_file(o.tokenizer), "--tokenizer: '", o.tokenizer,
              "' is not a file (expected a Hugging Face tokenizer.json)");
  KBN_CHECK(o.prompts.empty() || !tok_path.empty(), "--prompt: text needs a tokenizer, and ", spec.name,
            " has none (no tokenizer.json in its folder): pass --tokenizer path/to/tokenizer.json, or token ids "
            "with --prompt-ids");
  // Read only for text prompts: id prompts print ids (and need no tokenizer).
  std::optional<text::Tokenizer> tok;
  if (!o.prompts.empty()) tok.emplace(text::Tokenizer::from_file(tok_path));
  const int64_t vocab = spec.config.language_model().get_int("vocab_size");

  std::vector<std::string> prompt_texts;  // what the model reads, as text (empty for id prompts)
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : o.prompt_ids) prompts.push_back(parse_ids(p));
  for (const auto& p : o.prompts) {
    std::string t = p;
    if (p == "-") {
      KBN_CHECK(!isatty(STDIN_FILENO), "--prompt -: reads the prompt from stdin, which is a terminal here (pipe the "
                "text in: echo 'Hello' | kb_nano generate --prompt -)");
      t.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    KBN_CHECK(!t.empty(), "--prompt: the prompt is empty");
    KBN_CHECK(text::valid_utf8(t), "--prompt: the prompt is not valid UTF-8 text");
    bool add_special = true;
    if (o.chat) {
      const std::string folder = std::filesystem::path(tok_path).parent_path().string();
      const text::ChatTemplate tmpl = text::ChatTemplate::for_folder(folder.empty() ? "." : folder, *tok);
      std::vector<text::ChatMessage> msgs;
      if (!o.system.empty()) msgs.push_back({"system", o.system});
      msgs.push_back({"user", t});
      t = tmpl.render(msgs);
      add_special = false;  // the template writes its BOS
      std::fprintf(stderr, "  chat format: %s (hand-coded; from %s)\n", tmpl.name(), folder.c_str());
    }
    std::vector<int64_t> ids;
    for (int32_t id : tok->encode(t, add_special)) {
      KBN_CHECK(id < vocab, "--tokenizer: the prompt encodes to token id ", id, ", beyond ", spec.name,
                "'s vocab_size of ", vocab, " (", tok_path, " is not this model's tokenizer)");
      ids.push_back(id);
    }
    KBN_CHECK(!ids.empty(), "--prompt: the prompt encodes to no tokens");
    prompts.push_back(std::move(ids));
    prompt_texts.push_back(std::move(t));
  }
  if (prompts.empty()) {  // a seeded default prompt
    Tensor ids = Tensor::empty({8}, DType::i64);
    fill_randint_(ids, o.seed + 17, 0, spec.config.language_model().get_int("vocab_size"));
    prompts.push_back(ids.to_ints());
  }
  // Every position a prompt and its new tokens take must be one the model has (its rotary table ends there): checked
  // here, before the model is built, rather than found by an op mid-run.
  const int64_t max_pos = engine::max_positions(spec);
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
  gopts.kv_cache_dtype = o.kv_cache_dtype;
  if (o.stop_at_eos || o.chat) gopts.eos_token_ids = spec.config.get_int_list("eos_token_id");
  gopts.sampling.temperature = o.temperature;
  gopts.sampling.top_k = o.top_k;
  gopts.sampling.top_p = o.top_p;
  gopts.sampling.seed = o.seed;
  gopts.sampling.validate();

  // Text out: one prompt streams its completion as it is generated, after the prompt (echoed); several print
  // each prompt and completion when all are done. Special tokens are not printed (vLLM's skip_special_tokens).
  const bool text_out = !o.prompts.empty() && !o.ids;
  int64_t unknown_ids = 0;
  std::vector<text::DecodeStream> streams;
  std::vector<std::string> completions(prompts.size());
  if (text_out)
    for (const auto& p : prompts) {
      const std::vector<int32_t> p32(p.begin(), p.end());
      streams.emplace_back(*tok, true, p32);
    }
  const bool stream_now = text_out && prompts.size() == 1;
  auto on_token = [&](size_t i, int64_t id) {
    if (!tok->id_to_token(int32_t(id))) {
      ++unknown_ids;  // an id past the tokenizer's vocabulary (a padded or random-weight model's)
      return;
    }
    std::string piece = streams[i].push(int32_t(id));
    completions[i] += piece;
    if (stream_now) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  // Warm figures: on a GPU, one untimed pass first (its first kernels' loading and cuBLAS's set-up would otherwise
  // count); on the CPU the first pass is timed (cold), and said so.
  const bool warm = device.is_cuda() && !o.no_warmup;
  engine::GenerateOptions warm_opts = gopts;
  warm_opts.max_new_tokens = std::min<int64_t>(2, gopts.max_new_tokens);
  warm_opts.return_prompt_logits = false;
  if (text_out) gopts.on_token = on_token;
  if (stream_now) {
    std::fwrite(prompt_texts[0].data(), 1, prompt_texts[0].size(), stdout);
    std::fflush(stdout);
  }
  gopts.return_prompt_logits = !o.save_logits.empty();
  gopts.check_finite = o.check_finite;
  engine::GenerateResult r;
  if (o.tp == 1) {
    auto model = engine::build_model(spec, variant, popts, o.seed);
    if (warm) engine::generate_tokens(*model, prompts, device, variant, warm_opts);
    r = engine::generate_tokens(*model, prompts, device, variant, gopts);
  } else {
    if (spec.weights_path.empty())
      std::fprintf(stderr, "  note: random weights are drawn per shard, so --tp %d is a different random model from "
                   "--tp 1 (a checkpoint gives the same model at every --tp)\n", o.tp);
    engine::TensorParallelGroup group(o.tp, device);
    const auto models = engine::build_model_shards(spec, variant, popts, o.seed, group);
    std::vector<engine::GenerateResult> results(static_cast<size_t>(o.tp));
    group.run([&](int rank) {
      engine::GenerateOptions mine = gopts;
      if (rank != 0) mine.on_token = nullptr;  // rank 0 prints
      if (warm) engine::generate_tokens(*models[size_t(rank)], prompts, group.device_of(rank), variant, warm_opts);
      results[size_t(rank)] = engine::generate_tokens(*models[size_t(rank)], prompts, group.device_of(rank), variant,
                                                      mine);
    });
    for (int rank = 1; rank < o.tp; ++rank)
      KBN_CHECK(results[size_t(rank)].tokens == results[0].tokens, "--tp ", o.tp, ": rank ", rank,
                " generated other tokens than rank 0 (the ranks' logits must be identical after the gather)");
    r = std::move(results[0]);
  }

  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += int64_t(p.size());
  if (text_out) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::string rest = streams[i].flush();
      completions[i] += rest;
      if (stream_now) std::cout << rest << "\n";
      else std::cout << "[" << i << "] " << prompt_texts[i] << completions[i] << "\n";
    }
    std::cout.flush();
    if (unknown_ids)
      std::fprintf(stderr, "  note: %lld generated ids have no token in %s (ids >= its %lld; the model's vocabulary "
                   "is %lld) and print as nothing\n", (long long)unknown_ids, tok_path.c_str(),
                   (long long)tok->vocab_size(), (long long)vocab);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::cout << "prompt " << i << " (" << prompts[i].size() << " tokens) -> ";
      for (size_t j = 0; j < r.tokens[i].size(); ++j) std::cout << (j ? "," : "") << r.tokens[i][j];
      std::cout << "\n";
    }
  }
  double ms_per_step = r.decode_steps ? 1e3 * r.decode_seconds / double(r.decode_steps) : 0.0;
  std::fflush(stdout);
  std::fprintf(text_out ? stderr : stdout,
               "prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld steps, %.3f ms/step (%s)\n",
               (long long)prompt_tokens, r.prefill_seconds, double(prompt_tokens) / r.prefill_seconds,
               (long long)r.decode_steps, ms_per_step,
               warm ? "warm: after one untimed pass" : "cold: the first pass, timed");

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
    if (text_out) {
      j["prompt_texts"] = prompt_texts;
      j["completions"] = completions;
      j["tokenizer"] = tok_path;
    }
    j["sampling"] = {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"seed", o.seed}};
    j["timing"] = warm ? "warm" : "cold";
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
                                     "Text (or token ids) from an L4 model, greedy or sampled (default: the "
                                     "embedded model for this machine)");
  cmd->add_option("--model", o->model,
                  "Model name from models/, a config.json, or a local HF folder "
                  "(default: tiny-llama on CPU, llama-3.1-8b-instruct on GPU)");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda:0 when a GPU is present)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: f32 on CPU, the config's dtype on GPU)");
  cmd->add_option("--weights", o->weights, "HF folder or .safetensors file (default: seeded random weights)");
  cmd->add_option("--prompt", o->prompts,
                  "Prompt text ('-' reads stdin); repeat for a batch. Needs a tokenizer: the model's own or --tokenizer");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated token ids; repeat for a batch");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "A Hugging Face tokenizer.json (default: the model folder's, or --weights' folder's; the tiny "
                  "models have models/tokenizers/<name>.json)");
  cmd->add_flag("--ids", o->ids, "Print token ids instead of text");
  cmd->add_flag("--chat", o->chat,
                "Wrap the prompt as a user message in the model's chat format (hand-coded Llama-3, ChatML/Qwen, "
                "Gemma, Mistral; picked from the folder's chat template, else the tokenizer's tokens); implies "
                "--stop-at-eos");
  cmd->add_option("--system", o->system, "A system message for --chat");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy, the default)")
      ->check(positive_number(true));
  cmd->add_option("--top-k", o->top_k, "Sample from the k most likely tokens (0 = all)")
      ->check(integer_at_least(0));
  cmd->add_option("--top-p", o->top_p, "Sample from the smallest set of tokens whose probability reaches p (1 = all)")
      ->check(fraction_up_to_one());
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate per prompt")
      ->check(integer_at_least(1));
  cmd->add_option("--block-size", o->block_size, "KV cache block size")->check(integer_at_least(1));
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "auto (default: the model's dtype) or fp8 / fp8_e4m3 (fp8 e4m3 pages with the checkpoint's "
                  "per-tensor k_scale / v_scale, else 1.0)");
  cmd->add_option("--tp", o->tp,
                  "Tensor-parallel size: one thread per rank, rank r on cuda:r (NCCL) or, with --device cpu, on the "
                  "CPU (default 1)")
      ->check(integer_at_least(1, "a tensor-parallel size"));
  cmd->add_option("--seed", o->seed, "Seed for random weights, the default prompt and sampling (default 0)")
      ->check(seed_value());
  cmd->add_option("--variant", o->variant, "baseline or candidate");
  cmd->add_flag("--stop-at-eos", o->stop_at_eos, "Stop a sequence at the config's eos_token_id");
  cmd->add_flag("--check-finite", o->check_finite,
                "Check every step's logits for NaN/Inf and on the first failure name the first layer whose output "
                "was not finite (from the KV cache each layer wrote; one device-to-host copy of the logits per step)");
  cmd->add_flag("--no-warmup", o->no_warmup,
                "On a GPU, time the first pass (cold) instead of running one untimed pass before the timed one");
  cmd->add_option("--json", o->json, "Write tokens and timings to this JSON file");
  cmd->add_option("--save-logits", o->save_logits,
                  "Write every prompt position's logits (f32) to this .safetensors file, as prompt_logits.<i>");
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
