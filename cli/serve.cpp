// kb_nano serve: an OpenAI-compatible HTTP server on the continuous-batching engine.
//
// Endpoints: POST /v1/completions and /v1/chat/completions (streamed as server-sent events with "stream": true),
// GET /v1/models, GET /health. One engine thread owns the engine (LLMEngine is single-threaded): it admits the
// requests the HTTP threads hand it, steps while anything is unfinished, and publishes every running request's new
// tokens after each step. Each HTTP thread turns its request's tokens into text (DecodeStream) and applies its stop
// strings; a client that goes away mid-stream has its request aborted, and its KV blocks freed, before the next step.
//
// Requests are checked field by field: an unknown field, a value kb-nano does not implement (n > 1, logprobs,
// penalties), a prompt that does not fit max_model_len, malformed JSON: each is a 400 naming the field, never
// ignored. A "model" other than the served one is a 404.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/version.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace kbn::cli {
namespace {

using json = nlohmann::json;

// ---- the request's problem, as OpenAI's error object ----

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;
  std::string type() const {
    return status == 404 ? "NotFoundError" : status >= 500 ? "InternalServerError" : "BadRequestError";
  }
};

std::string error_body(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type()},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.status}}}};
  return j.dump();
}

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError{400, message, param}; }

// ---- what the engine thread and an HTTP thread share for one request ----

struct Channel {
  std::mutex m;
  std::condition_variable cv;
  std::vector<int64_t> tokens;  // every token generated so far (grows only)
  bool admitted = false;        // the engine took it (or refused it: error set)
  bool done = false;
  engine::FinishReason reason = engine::FinishReason::none;
  std::string error;
};

class EngineLoop {
 public:
  explicit EngineLoop(engine::LLMEngine& engine) : engine_(engine), thread_([this] { run(); }) {}
  ~EngineLoop() {
    {
      std::lock_guard<std::mutex> g(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Hands `r` to the engine and waits until it is admitted; a refusal (too long for the KV cache, ...) is an
  // ApiError with the engine's words.
  std::shared_ptr<Channel> submit(engine::Request r) {
    auto ch = std::make_shared<Channel>();
    {
      std::lock_guard<std::mutex> g(m_);
      if (failed_) throw ApiError{500, "the engine stopped after an error: " + fatal_, ""};
      pending_.emplace_back(std::move(r), ch);
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> l(ch->m);
    ch->cv.wait(l, [&] { return ch->admitted; });
    if (!ch->error.empty()) throw ApiError{400, ch->error, ""};
    return ch;
  }

  // The request's client went away, or its stop string was found: drop it before the next step.
  void abort(int64_t id) {
    {
      std::lock_guard<std::mutex> g(m_);
      aborts_.push_back(id);
    }
    cv_.notify_all();
  }

  bool healthy() {
    std::lock_guard<std::mutex> g(m_);
    return !failed_;
  }
  int64_t aborted() const { return aborted_.load(); }

 private:
  void finish(Channel& ch, engine::FinishReason reason, const std::string& error) {
    {
      std::lock_guard<std::mutex> g(ch.m);
      ch.admitted = true;
      ch.done = true;
      ch.reason = reason;
      if (!error.empty()) ch.error = error;
    }
    ch.cv.notify_all();
  }

  void run() {
    while (true) {
      std::vector<std::pair<engine::Request, std::shared_ptr<Channel>>> incoming;
      std::vector<int64_t> aborts;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stopping_ || !pending_.empty() || !aborts_.empty() || engine_.has_unfinished(); });
        if (stopping_) break;
        incoming.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
        pending_.clear();
        aborts.swap(aborts_);
      }
      for (auto& [req, ch] : incoming) {
        try {
          engine_.add_request(req);
          live_[req.id] = ch;
          std::lock_guard<std::mutex> g(ch->m);
          ch->admitted = true;
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(ch->m);
          ch->admitted = true;
          ch->done = true;
          ch->error = e.what();
        }
        ch->cv.notify_all();
      }
      for (int64_t id : aborts) {
        if (engine_.abort_request(id)) aborted_++;
        if (auto it = live_.find(id); it != live_.end()) {
          finish(*it->second, engine::FinishReason::aborted, "");
          live_.erase(it);
        }
      }
      if (!engine_.has_unfinished()) continue;
      std::vector<engine::RequestOutput> finished;
      try {
        finished = engine_.step();
      } catch (const std::exception& e) {
        // The engine's state is unknown after a failed step: every request ends with the error, and the server
        // reports itself unhealthy (a 500 for every later request) rather than serve from a broken cache.
        std::fprintf(stderr, "kb_nano serve: engine step failed: %s\n", e.what());
        std::lock_guard<std::mutex> g(m_);
        failed_ = true;
        fatal_ = e.what();
        for (auto& [id, ch] : live_) finish(*ch, engine::FinishReason::none, std::string("engine step failed: ") + e.what());
        live_.clear();
        break;
      }
      for (const engine::Sequence* s : engine_.scheduler().running()) {
        auto it = live_.find(s->id);
        if (it == live_.end()) continue;
        Channel& ch = *it->second;
        bool grew = false;
        {
          std::lock_guard<std::mutex> g(ch.m);
          if (s->output.size() > ch.tokens.size()) {  // only the new ones: the hot loop stays O(new tokens)
            ch.tokens.insert(ch.tokens.end(), s->output.begin() + int64_t(ch.tokens.size()), s->output.end());
            grew = true;
          }
        }
        if (grew) ch.cv.notify_all();
      }
      for (engine::RequestOutput& o : finished) {
        auto it = live_.find(o.id);
        if (it == live_.end()) continue;
        {
          std::lock_guard<std::mutex> g(it->second->m);
          it->second->tokens = std::move(o.tokens);
        }
        finish(*it->second, o.finish_reason, "");
        live_.erase(it);
      }
    }
    // Stopping: whoever still waits gets an error rather than a hang.
    std::lock_guard<std::mutex> g(m_);
    for (auto& [req, ch] : pending_) finish(*ch, engine::FinishReason::none, "the server is shutting down");
    for (auto& [id, ch] : live_) finish(*ch, engine::FinishReason::none, failed_ ? fatal_ : "the server is shutting down");
  }

  engine::LLMEngine& engine_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<engine::Request, std::shared_ptr<Channel>>> pending_;
  std::vector<int64_t> aborts_;
  std::unordered_map<int64_t, std::shared_ptr<Channel>> live_;  // engine thread only
  bool stopping_ = false;
  bool failed_ = false;
  std::string fatal_;
  std::atomic<int64_t> aborted_{0};
  std::thread thread_;  // last: starts once the members above exist
};

// ---- the served model and its request rules ----

struct Served {
  std::string name;
  int64_t max_model_len = 0;
  int64_t vocab = 0;
  std::vector<int64_t> eos;
  const text::Tokenizer* tok = nullptr;
  std::optional<text::ChatTemplate> chat;
  std::string chat_why;  // why there is no chat format
  std::atomic<int64_t> next_id{0};
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seed_m;
};

struct Parsed {
  engine::Request req;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::string> stop;
  bool skip_special = true;
};

double number(const json& j, const std::string& key) {
  if (!j.is_number()) bad(key, "'" + key + "' must be a number, got " + std::string(j.type_name()));
  return j.get<double>();
}

int64_t integer(const json& j, const std::string& key) {
  if (!j.is_number_integer() && !j.is_number_unsigned())
    bad(key, "'" + key + "' must be an integer, got " + (j.is_number() ? j.dump() : std::string(j.type_name())));
  return j.get<int64_t>();
}

bool boolean(const json& j, const std::string& key) {
  if (!j.is_boolean()) bad(key, "'" + key + "' must be true or false, got " + std::string(j.type_name()));
  return j.get<bool>();
}

Parsed parse_request(const std::string& body, bool chat, Served& sv) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", "the body must be a JSON object");
  // Fields of OpenAI's API (and vLLM's top_k, ignore_eos, skip_special_tokens): the ones kb-nano implements, and
  // the ones it accepts only at their no-op values.
  static const std::set<std::string> completion_fields = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options", "stop",
      "n", "echo", "logprobs", "presence_penalty", "frequency_penalty", "user", "ignore_eos", "best_of", "suffix",
      "logit_bias", "skip_special_tokens"};
  static const std::set<std::string> chat_fields = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
      "stream_options", "stop", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "user",
      "ignore_eos", "logit_bias", "skip_special_tokens", "tools", "tool_choice", "parallel_tool_calls"};
  const auto& known = chat ? chat_fields : completion_fields;
  for (const auto& [k, v] : j.items())
    if (!known.count(k))
      bad(k, "unknown field '" + k + "' (kb-nano's " + std::string(chat ? "/v1/chat/completions" : "/v1/completions") +
                 " takes OpenAI's fields and vLLM's top_k, ignore_eos, skip_special_tokens)");
  auto has = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };
  if (has("model")) {
    if (!j.at("model").is_string()) bad("model", "'model' must be a string");
    if (j.at("model").get<std::string>() != sv.name)
      throw ApiError{404, "The model '" + j.at("model").get<std::string>() + "' does not exist; this server serves '" +
                              sv.name + "'",
                     "model"};
  }
  // Accepted only at their no-op values.
  if (has("n") && integer(j.at("n"), "n") != 1) bad("n", "'n' must be 1 (one choice per request)");
  if (has("best_of") && integer(j.at("best_of"), "best_of") != 1) bad("best_of", "'best_of' must be 1");
  if (has("echo") && boolean(j.at("echo"), "echo")) bad("echo", "'echo' is not supported (false only)");
  if (has("suffix")) bad("suffix", "'suffix' is not supported");
  if (has("logprobs") && !(j.at("logprobs").is_boolean() && !j.at("logprobs").get<bool>()))
    bad("logprobs", "'logprobs' is not supported (null or false only)");
  if (has("top_logprobs")) bad("top_logprobs", "'top_logprobs' is not supported");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (has(k) && number(j.at(k), k) != 0.0) bad(k, std::string("'") + k + "' is not supported (0 only)");
  if (has("logit_bias") && !(j.at("logit_bias").is_object() && j.at("logit_bias").empty()))
    bad("logit_bias", "'logit_bias' is not supported (empty only)");
  if (has("tools") && !(j.at("tools").is_array() && j.at("tools").empty()))
    bad("tools", "'tools' is not supported (tool calls are not parsed)");
  if (has("tool_choice") && j.at("tool_choice") != "none") bad("tool_choice", "'tool_choice' must be \"none\"");
  if (has("user") && !j.at("user").is_string()) bad("user", "'user' must be a string");

  Parsed p;
  p.req.id = sv.next_id++;
  std::vector<int64_t> prompt;
  if (chat) {
    if (!sv.chat) bad("messages", "this model has no chat format kb-nano knows (" + sv.chat_why + ")");
    if (!has("messages") || !j.at("messages").is_array() || j.at("messages").empty())
      bad("messages", "'messages' must be a non-empty list of {role, content}");
    std::vector<text::ChatMessage> msgs;
    for (size_t i = 0; i < j.at("messages").size(); ++i) {
      const json& m = j.at("messages")[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m.at("role").is_string())
        bad(where, where + " must be an object with a string 'role'");
      std::string content;
      if (m.contains("content") && m.at("content").is_string()) {
        content = m.at("content").get<std::string>();
      } else if (m.contains("content") && m.at("content").is_array()) {  // [{type: text, text: ...}, ...]
        for (const json& part : m.at("content")) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part.at("text").is_string())
            bad(where, where + ".content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
          content += part.at("text").get<std::string>();
        }
      } else {
        bad(where, where + " must have a string 'content' (or a list of text parts)");
      }
      for (const auto& [k, v] : m.items())
        if (k != "role" && k != "content" && k != "name") bad(where, where + ": unknown field '" + k + "'");
      if (!text::valid_utf8(content)) bad(where, where + ".content is not valid UTF-8");
      msgs.push_back({m.at("role").get<std::string>(), content});
    }
    std::string prompt_text;
    try {
      prompt_text = sv.chat->render(msgs);
    } catch (const Error& e) {
      bad("messages", e.what());
    }
    for (int32_t id : sv.tok->encode(prompt_text, false)) prompt.push_back(id);
  } else {
    if (!has("prompt")) bad("prompt", "'prompt' is required (a string or a list of token ids)");
    const json& pj = j.at("prompt");
    const json* one = &pj;
    if (pj.is_array() && !pj.empty() && (pj[0].is_string() || pj[0].is_array())) {
      if (pj.size() != 1) bad("prompt", "one prompt per request: a list of " + std::to_string(pj.size()) + " prompts");
      one = &pj[0];
    }
    if (one->is_string()) {
      const std::string s = one->get<std::string>();
      if (!text::valid_utf8(s)) bad("prompt", "'prompt' is not valid UTF-8");
      for (int32_t id : sv.tok->encode(s, true)) prompt.push_back(id);
    } else if (one->is_array()) {
      for (const json& t : *one) {
        if (!t.is_number_integer()) bad("prompt", "a token-id prompt must hold integers only");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= sv.vocab)
          bad("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(sv.vocab) + ")");
        prompt.push_back(id);
      }
    } else {
      bad("prompt", "'prompt' must be a string or a list of token ids");
    }
  }
  if (prompt.empty()) bad(chat ? "messages" : "prompt", "the prompt is empty");
  for (int64_t id : prompt)
    if (id >= sv.vocab)
      bad(chat ? "messages" : "prompt", "the prompt encodes to token id " + std::to_string(id) +
                                            ", beyond the model's vocabulary of " + std::to_string(sv.vocab));
  const int64_t n = int64_t(prompt.size());
  if (n >= sv.max_model_len)
    bad(chat ? "messages" : "prompt", "This model's maximum context length is " + std::to_string(sv.max_model_len) +
                                          " tokens; the prompt has " + std::to_string(n) +
                                          " (room for no completion token)");
  int64_t max_tokens = chat ? sv.max_model_len - n : 16;  // OpenAI's completions default; chat fills the context
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (has(k)) {
      max_tokens = integer(j.at(k), k);
      if (max_tokens < 1) bad(k, std::string("'") + k + "' must be >= 1");
      if (n + max_tokens > sv.max_model_len)
        bad(k, "This model's maximum context length is " + std::to_string(sv.max_model_len) + " tokens; the prompt (" +
                   std::to_string(n) + " tokens) and " + k + " (" + std::to_string(max_tokens) + ") ask for " +
                   std::to_string(n + max_tokens));
    }
  engine::SamplingParams& sp = p.req.sampling;
  sp.max_tokens = max_tokens;
  sp.temperature = has("temperature") ? number(j.at("temperature"), "temperature") : 1.0;
  if (!(sp.temperature >= 0.0 && sp.temperature <= 100.0)) bad("temperature", "'temperature' must be in [0, 100]");
  sp.top_p = has("top_p") ? number(j.at("top_p"), "top_p") : 1.0;
  if (!(sp.top_p > 0.0 && sp.top_p <= 1.0)) bad("top_p", "'top_p' must be in (0, 1]");
  sp.top_k = has("top_k") ? integer(j.at("top_k"), "top_k") : 0;
  if (sp.top_k < -1) bad("top_k", "'top_k' must be >= 1, or 0 / -1 for all tokens");
  if (has("seed")) {
    sp.seed = uint64_t(integer(j.at("seed"), "seed"));
  } else {
    std::lock_guard<std::mutex> g(sv.seed_m);
    sp.seed = sv.seeds();
  }
  sp.ignore_eos = has("ignore_eos") && boolean(j.at("ignore_eos"), "ignore_eos");
  sp.eos_token_ids = sv.eos;
  p.req.prompt = std::move(prompt);
  p.stream = has("stream") && boolean(j.at("stream"), "stream");
  if (has("stream_options")) {
    const json& so = j.at("stream_options");
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    for (const auto& [k, v] : so.items())
      if (k != "include_usage" && k != "continuous_usage_stats")
        bad("stream_options", "stream_options: unknown field '" + k + "'");
    if (so.contains("include_usage")) p.include_usage = boolean(so.at("include_usage"), "stream_options.include_usage");
  }
  if (has("stop")) {
    const json& st = j.at("stop");
    if (st.is_string()) p.stop.push_back(st.get<std::string>());
    else if (st.is_array())
      for (const json& s : st) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    else bad("stop", "'stop' must be a string or a list of strings");
    if (p.stop.size() > 4) bad("stop", "at most 4 stop strings");
    for (const auto& s : p.stop)
      if (s.empty()) bad("stop", "a stop string must not be empty");
  }
  if (has("skip_special_tokens")) p.skip_special = boolean(j.at("skip_special_tokens"), "skip_special_tokens");
  return p;
}

// ---- tokens to text, with stop strings ----

// Text of one request as its tokens arrive: held back while a character is unfinished or the tail could still be
// the start of a stop string; a stop string ends the text before it.
class TextOut {
  // The prompt as context for the decoder: ids the tokenizer lacks (a token-id prompt may hold a padded
  // vocabulary's) have no text and are left out.
  static std::vector<int32_t> known_ids(const text::Tokenizer& tok, const std::vector<int64_t>& ids) {
    std::vector<int32_t> out;
    for (int64_t id : ids)
      if (tok.id_to_token(int32_t(id))) out.push_back(int32_t(id));
    return out;
  }

 public:
  TextOut(const text::Tokenizer& tok, const Parsed& p)
      : tok_(tok), stream_(tok, p.skip_special, known_ids(tok, p.req.prompt)), stop_(p.stop) {
    for (const auto& s : stop_) hold_ = std::max(hold_, s.size() - 1);
  }
  // New text for tokens[from, to); `stopped` becomes true when a stop string appeared.
  std::string add(const std::vector<int64_t>& tokens, size_t from) {
    for (size_t i = from; i < tokens.size() && !stopped; ++i) {
      if (!tok_.id_to_token(int32_t(tokens[i]))) continue;  // an id past the tokenizer (a padded vocabulary)
      pending_ += stream_.push(int32_t(tokens[i]));
      check_stop();
    }
    return release(false);
  }
  std::string finish() {
    if (!stopped) {
      pending_ += stream_.flush();
      check_stop();
    }
    return release(true);
  }
  bool stopped = false;

 private:
  void check_stop() {
    size_t best = std::string::npos;
    for (const auto& s : stop_) best = std::min(best, pending_.find(s));
    if (best != std::string::npos) {
      pending_.resize(best);
      stopped = true;
    }
  }
  std::string release(bool all) {
    size_t n = pending_.size();
    if (!all && !stopped && hold_ > 0) {
      n = n > hold_ ? n - hold_ : 0;
      while (n > 0 && (uint8_t(pending_[n]) & 0xC0) == 0x80) --n;  // not inside a character
    }
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return out;
  }
  const text::Tokenizer& tok_;
  text::DecodeStream stream_;
  std::vector<std::string> stop_;
  size_t hold_ = 0;
  std::string pending_;
};

std::string finish_reason(engine::FinishReason r, bool stopped) {
  if (stopped || r == engine::FinishReason::eos) return "stop";
  return "length";  // max_tokens, max_model_len
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string model;
  std::string device;
  std::string dtype;
  std::string weights;
  std::string tokenizer;
  std::string served_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string variant = "baseline";
  std::string mode;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t num_kv_blocks = 0;
  std::string kv_cache_dtype = "auto";
  NanoBatchFlags nano;
  bool async_scheduling = false;
  int64_t max_body_bytes = 8 << 20;
  int tp = 1;
  double gpu_memory_utilization = 0.9;
  uint64_t seed = 0;
};

void run(const Options& o) {
  // SIGINT / SIGTERM end the server cleanly: blocked in every thread, taken by one that stops the listener.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const Device device = resolve_device(o.device);
  const engine::ModelSpec spec = resolve_model_spec(o.model, o.weights, device);
  KBN_CHECK(o.variant == "baseline" || o.variant == "candidate", "--variant: expected baseline or candidate, got '",
            o.variant, "'");
  const Variant variant = o.variant == "baseline" ? Variant::baseline : Variant::candidate;
  const std::string mode_name = o.mode.empty() ? (device.is_cuda() ? "graph" : "eager") : o.mode;
  KBN_CHECK(mode_name == "eager" || mode_name == "graph", "--mode: expected eager or graph, got '", mode_name, "'");
  KBN_CHECK(mode_name == "eager" || device.is_cuda(), "--mode graph: CUDA graphs need a CUDA device; got ",
            device.str());
  const std::string tok_path = resolve_tokenizer_path(o.tokenizer, o.weights, spec);
  KBN_CHECK(!tok_path.empty(), "--tokenizer: ", spec.name,
            " has no tokenizer.json in its folder; the server needs one for text (pass --tokenizer tokenizer.json)");
  KBN_CHECK(std::filesystem::is_regular_file(tok_path), "--tokenizer: '", tok_path,
            "' is not a file (expected a Hugging Face tokenizer.json)");
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);

  Served sv;
  sv.name = o.served_name.empty() ? spec.name : o.served_name;
  sv.tok = &tok;
  sv.vocab = spec.config.language_model().get_int("vocab_size");
  sv.eos = spec.config.get_int_list("eos_token_id");
  const int64_t max_pos = engine::max_positions(spec);
  sv.max_model_len = o.max_model_len > 0 ? o.max_model_len : max_pos;
  KBN_CHECK(sv.max_model_len >= 2 && sv.max_model_len <= max_pos, "--max-model-len: expected 2..", max_pos,
            " (the model's max_position_embeddings), got ", sv.max_model_len);
  try {
    const std::string folder = std::filesystem::path(tok_path).parent_path().string();
    sv.chat = text::ChatTemplate::for_folder(folder.empty() ? "." : folder, tok);
  } catch (const Error& e) {
    sv.chat_why = e.what();
  }

  const ParamOptions popts{o.dtype.empty() ? engine::default_dtype(spec, device) : parse_dtype(o.dtype), device};
  std::fprintf(stderr, "kb_nano serve: %s on %s, %s, %s weights, %s variant, %s mode; tokenizer %s; chat %s\n",
               spec.name.c_str(), device.str().c_str(), dtype_name(popts.dtype),
               spec.weights_path.empty() ? ("random (seed " + std::to_string(o.seed) + ")").c_str()
                                         : spec.weights_path.c_str(),
               o.variant.c_str(), mode_name.c_str(), tok_path.c_str(), sv.chat ? sv.chat->name() : "none");
  // Tensor parallel: one rank thread per GPU (or CPU rank), as eval --tp; the engine steps all ranks together.
  std::unique_ptr<engine::TensorParallelGroup> group;
  if (o.tp > 1) {
    group = std::make_unique<engine::TensorParallelGroup>(o.tp, device);
    std::fprintf(stderr, "  tensor parallel %d: %s; collectives: %s\n", o.tp,
                 device.is_cpu() ? "CPU ranks" : "rank r on cuda:r", group->collectives().c_str());
  }
  engine::EngineConfig ecfg;
  ecfg.max_model_len = sv.max_model_len;
  ecfg.max_num_seqs = o.max_num_seqs > 0 ? o.max_num_seqs : (device.is_cuda() ? 256 : 16);
  if (o.max_num_batched_tokens > 0) ecfg.max_num_batched_tokens = o.max_num_batched_tokens;
  ecfg.num_kv_blocks = o.num_kv_blocks;
  ecfg.gpu_memory_utilization = o.gpu_memory_utilization;
  ecfg.mode = engine::parse_execution_mode(mode_name);
  ecfg.kv_cache_dtype = o.kv_cache_dtype;
  ecfg.nano_batching = o.nano.resolve(o.tp);
  KBN_CHECK(!o.async_scheduling || o.tp == 1, "--async-scheduling: needs --tp 1, got --tp ", o.tp);
  ecfg.async_scheduling = o.async_scheduling;
  const ModelEngine m = build_model_engine(spec, variant, popts, o.seed, device, ecfg, group.get());
  engine::LLMEngine& eng = *m.engine;
  warm_up(eng, sv.max_model_len, 2);  // before the first client
  EngineLoop loop(eng);

  httplib::Server svr;
  const size_t threads = size_t(ecfg.max_num_seqs) + 8;  // a streaming request holds its thread
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(size_t(o.max_body_bytes));
  svr.set_read_timeout(60, 0);
  svr.set_write_timeout(60, 0);
  auto send_error = [](httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
  };
  svr.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int status = res.status;
    send_error(res, ApiError{status,
                             status == 404   ? "no such endpoint (kb-nano serves /v1/completions, /v1/chat/completions, "
                                               "/v1/models, /health)"
                             : status == 413 ? "the request body is larger than --max-body-bytes (" +
                                                   std::to_string(o.max_body_bytes) + ")"
                                             : "HTTP error " + std::to_string(status),
                             ""});
  });
  svr.set_exception_handler([&](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "kb_nano serve: a request failed: %s\n", what.c_str());
    send_error(res, ApiError{500, what, ""});
  });
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (loop.healthy()) res.set_content("{}", "application/json");
    else send_error(res, ApiError{503, "the engine stopped after an error", ""});
  });
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    json m = {{"object", "list"},
              {"data",
               {{{"id", sv.name},
                 {"object", "model"},
                 {"created", unix_now()},
                 {"owned_by", "kb-nano"},
                 {"root", spec.name},
                 {"max_model_len", sv.max_model_len},
                 {"vocab_size", sv.vocab}}}}};
    res.set_content(m.dump(), "application/json");
  });

  auto handle = [&](bool chat, const httplib::Request& hreq, httplib::Response& res) {
    std::shared_ptr<Parsed> p;
    std::shared_ptr<Channel> ch;
    try {
      p = std::make_shared<Parsed>(parse_request(hreq.body, chat, sv));
      ch = loop.submit(p->req);
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(p->req.id);
    const std::string model_name = sv.name;
    const int64_t created = unix_now();
    const int64_t prompt_tokens = int64_t(p->req.prompt.size());
    // By value: the streaming callbacks below run after this handler has returned.
    auto usage = [=](int64_t completion) {
      return json{{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion},
                  {"total_tokens", prompt_tokens + completion}};
    };
    auto choice = [=](const std::string& piece, const json& reason, bool first) {
      json c = {{"index", 0}, {"finish_reason", reason}};
      if (!chat) {
        c["text"] = piece;
        c["logprobs"] = nullptr;
      } else {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!piece.empty() || (first && reason.is_null())) delta["content"] = piece;
        c["delta"] = delta;
      }
      return c;
    };
    if (!p->stream) {
      TextOut out(tok, *p);
      std::string text;
      std::vector<int64_t> tokens;  // every token so far (the channel's, copied as they come)
      size_t seen = 0;
      engine::FinishReason reason = engine::FinishReason::none;
      size_t ntok = 0;
      while (true) {
        bool done = false;
        {
          std::unique_lock<std::mutex> l(ch->m);
          ch->cv.wait(l, [&] { return ch->done || ch->tokens.size() > seen; });
          tokens.insert(tokens.end(), ch->tokens.begin() + int64_t(tokens.size()), ch->tokens.end());
          done = ch->done;
          reason = ch->reason;
          if (done && !ch->error.empty()) {
            send_error(res, ApiError{500, ch->error, ""});
            return;
          }
        }
        text += out.add(tokens, seen);
        seen = tokens.size();
        ntok = tokens.size();
        if (out.stopped && !done) {
          loop.abort(p->req.id);
          break;
        }
        if (done) break;
      }
      text += out.finish();
      json r = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"usage", usage(int64_t(ntok))}};
      json c = {{"index", 0}, {"finish_reason", finish_reason(reason, out.stopped)}};
      if (chat) c["message"] = {{"role", "assistant"}, {"content", text}};
      else {
        c["text"] = text;
        c["logprobs"] = nullptr;
      }
      r["choices"] = json::array({c});
      res.set_content(r.dump(), "application/json");
      return;
    }
    // Streaming: one server-sent event per step's new text; the last names the finish reason; then the usage when
    // asked; then [DONE]. A write that fails (the client left) aborts the request.
    struct State {
      std::unique_ptr<TextOut> out;
      std::vector<int64_t> tokens;  // the channel's tokens copied so far
      size_t seen = 0;
      bool first = true;
      bool finished = false;
    };
    auto st = std::make_shared<State>();
    st->out = std::make_unique<TextOut>(tok, *p);
    auto chunk_of = [=](const json& choices, const json& use) {
      json r = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", choices}};
      if (!use.is_null()) r["usage"] = use;
      return "data: " + r.dump() + "\n\n";
    };
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, &loop, &tok](size_t, httplib::DataSink& sink) {
          std::vector<int64_t>& tokens = st->tokens;
          bool done = false;
          engine::FinishReason reason = engine::FinishReason::none;
          std::string error;
          {
            std::unique_lock<std::mutex> l(ch->m);
            ch->cv.wait_for(l, std::chrono::milliseconds(500), [&] { return ch->done || ch->tokens.size() > st->seen; });
            tokens.insert(tokens.end(), ch->tokens.begin() + int64_t(tokens.size()), ch->tokens.end());
            done = ch->done;
            reason = ch->reason;
            error = ch->error;
          }
          if (!sink.is_writable()) return false;  // the client left: the releaser aborts the request
          std::string piece = st->out->add(tokens, st->seen);
          st->seen = tokens.size();
          const bool stopped = st->out->stopped;
          if (stopped && !done) loop.abort(p->req.id);
          std::string data;
          if (!error.empty()) {
            data = "data: " + error_body(ApiError{500, error, ""}) + "\n\n";
          } else if (done || stopped) {
            piece += st->out->finish();
            if ((st->first && chat) || !piece.empty())
              data += chunk_of(json::array({choice(piece, nullptr, st->first)}), nullptr);
            st->first = false;
            data += chunk_of(json::array({choice("", finish_reason(reason, stopped), false)}), nullptr);
            if (p->include_usage) data += chunk_of(json::array(), usage(int64_t(st->seen)));
          } else if (!piece.empty() || (st->first && chat)) {  // chat opens with the assistant's role
            data = chunk_of(json::array({choice(piece, nullptr, st->first)}), nullptr);
            st->first = false;
          }
          if (done || stopped || !error.empty()) data += "data: [DONE]\n\n";
          if (!data.empty() && !sink.write(data.data(), data.size())) return false;
          if (done || stopped || !error.empty()) {
            st->finished = true;
            sink.done();
          }
          return true;
        },
        [=, &loop](bool) {
          if (!st->finished) {  // the client left before the last event (after it, there is nothing to abort)
            std::fprintf(stderr, "kb_nano serve: request %lld aborted (the client disconnected)\n",
                         (long long)p->req.id);
            loop.abort(p->req.id);
          }
        });
  };
  svr.Post("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) { handle(false, q, r); });
  svr.Post("/v1/chat/completions", [&](const httplib::Request& q, httplib::Response& r) { handle(true, q, r); });

  // cpp-httplib listens with a backlog of 5 (compiled into Debian's library): a burst of connections (a benchmark
  // sending every request at once) overflows it and clients see their connection drop. The listening socket is
  // kept here and listen() called again on it with the system's largest backlog, which Linux applies in place.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    KBN_CHECK(port > 0, "--host: cannot listen on '", o.host, "' (any port)");
  } else {
    KBN_CHECK(svr.bind_to_port(o.host, port), "--port: cannot listen on ", o.host, ":", port,
              " (in use, or not allowed)");
  }
  KBN_CHECK(listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) == 0, "serve: cannot widen the listen backlog of ",
            o.host, ":", port);
  std::fprintf(stderr, "kb_nano serve: listening on http://%s:%d (model '%s', max_model_len %lld, max_num_seqs %lld)\n",
               o.host.c_str(), port, sv.name.c_str(), (long long)sv.max_model_len, (long long)ecfg.max_num_seqs);
  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "kb_nano serve: signal %d, stopping\n", sig);
    svr.stop();
  });
  svr.listen_after_bind();
  // The listener stopped (a signal, or it failed): wake the signal thread if no signal came.
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  std::fprintf(stderr, "kb_nano serve: stopped (%lld requests aborted by their clients)\n",
               (long long)loop.aborted());
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve",
                                     "An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
                                     "/v1/models, /health) on the continuous-batching engine");
  cmd->add_option("--model", o->model,
                  "Model name from models/, a config.json, or a local HF folder (default: tiny-llama on CPU, "
                  "llama-3.1-8b-instruct on GPU)");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda:0 when a GPU is present)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: f32 on CPU, the config's dtype on GPU)");
  cmd->add_option("--weights", o->weights, "HF folder or .safetensors file (default: seeded random weights)");
  cmd->add_option("--tokenizer", o->tokenizer, "A Hugging Face tokenizer.json (default: the model's own)");
  cmd->add_option("--served-model-name", o->served_name, "The name clients give as \"model\" (default: --model)");
  cmd->add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Port (default 8000; 0 = any free port, printed at start)")
      ->check(integer_in(0, 65535));
  cmd->add_option("--variant", o->variant, "baseline or candidate");
  cmd->add_option("--tp", o->tp,
                  "Tensor-parallel size: one thread per rank, rank r on cuda:r (NCCL) or, with --device cpu, on the "
                  "CPU (default 1)")
      ->check(integer_at_least(1, "a tensor-parallel size"));
  cmd->add_option("--mode", o->mode, "eager or graph (default: graph on CUDA, eager on CPU)");
  cmd->add_option("--max-model-len", o->max_model_len,
                  "Prompt + completion tokens per request (0, the default: the model's max_position_embeddings)")
      ->check(integer_at_least(0));
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Requests running at once (0, the default: 256 on GPU, 16 on CPU)")
      ->check(integer_at_least(0));
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                  "Token budget of one step (0, the default: 8192)")
      ->check(integer_at_least(0));
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "auto (default: the model's dtype) or fp8 / fp8_e4m3 (fp8 e4m3 pages with the checkpoint's "
                  "per-tensor k_scale / v_scale, else 1.0)");
  o->nano.add_to(cmd);
  cmd->add_flag("--async-scheduling", o->async_scheduling,
                "Schedule and launch each greedy step before the previous one's token ids reach the host (vLLM's "
                "async scheduling): the same tokens, the host's work under the GPU's; --tp 1");
  cmd->add_option("--num-kv-blocks", o->num_kv_blocks, "KV cache blocks (0, the default: sized from memory)")
      ->check(integer_at_least(0));
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Share of the GPU's memory the engine may fill (default 0.9)")
      ->check(fraction_up_to_one());
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body accepted (default 8 MiB; larger: 413)")
      ->check(integer_at_least(1024));
  cmd->add_option("--seed", o->seed, "Seed for random weights (default 0)")->check(seed_value());
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
