#include "engine/workloads.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kbn/error.h"
#include "kbn/rng.h"

namespace kbn::engine {

namespace {

// Within +-25% of the mean.
WorkloadSpec around(std::string name, std::string description, int64_t num_requests, int64_t input, int64_t output,
                    int64_t max_num_seqs = 0) {
  return {std::move(name),   std::move(description), num_requests,        input - input / 4,
          input + input / 4, output - output / 4,    output + output / 4, max_num_seqs};
}

// Uniform integer in [lo, hi] from a Philox stream: draw `i` of stream `key`.
int64_t uniform_int(uint64_t key, uint64_t i, int64_t lo, int64_t hi) {
  const Philox4x32 r = philox4x32_10(i, key);
  const uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
  return lo + int64_t(x % uint64_t(hi - lo + 1));
}

int64_t scaled(int64_t n, double scale) { return std::max<int64_t>(1, int64_t(std::llround(double(n) * scale))); }

}  // namespace

const std::vector<WorkloadSpec>& workload_specs() {
  static const std::vector<WorkloadSpec> specs = {
      around("prefill-heavy", "1000 requests, ~1024 prompt / ~512 output tokens", 1000, 1024, 512),
      around("balanced", "1000 requests, ~512 prompt / ~512 output tokens", 1000, 512, 512),
      around("decode-heavy", "1000 requests, ~512 prompt / ~1024 output tokens", 1000, 512, 1024),
      {"long-context", "32 requests, 8k-32k prompt / ~256 output tokens", 32, 8192, 32768, 192, 320, 0},
      {"latency-b1", "16 requests of 128 prompt / 128 output tokens, one at a time", 16, 128, 128, 128, 128, 1},
      {"latency-b32", "96 requests of 128 prompt / 128 output tokens, 32 at a time", 96, 128, 128, 128, 128, 32},
  };
  return specs;
}

const WorkloadSpec& workload_spec(const std::string& name) {
  std::string known;
  for (const auto& s : workload_specs()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  KBN_FAIL("--workload: unknown workload '", name, "'; expected one of ", known);
}

Workload make_workload(const std::string& name, const WorkloadOptions& o) { return make_workload(workload_spec(name), o); }

WorkloadSpec random_workload_spec(int64_t input_len, int64_t output_len, int64_t num_prompts, double range_ratio) {
  KBN_CHECK(input_len >= 1, "--input-len: expected a prompt length >= 1, got ", input_len);
  KBN_CHECK(output_len >= 1, "--output-len: expected an output length >= 1, got ", output_len);
  KBN_CHECK(num_prompts >= 1, "--num-prompts: expected a count >= 1, got ", num_prompts);
  KBN_CHECK(range_ratio >= 0 && range_ratio < 1, "--range-ratio: expected a fraction in [0, 1), got ", range_ratio);
  // vLLM: randint(int(len * (1 - r)), int(len * (1 + r)) + 1), i.e. inclusive bounds, floored; at least 1 token.
  auto lo = [&](int64_t n) { return std::max<int64_t>(1, int64_t(std::floor(double(n) * (1 - range_ratio)))); };
  auto hi = [&](int64_t n) { return std::max<int64_t>(1, int64_t(std::floor(double(n) * (1 + range_ratio)))); };
  char desc[160];
  std::snprintf(desc, sizeof desc, "%lld requests, %lld prompt / %lld output tokens, range ratio %g (vLLM's random)",
                (long long)num_prompts, (long long)input_len, (long long)output_len, range_ratio);
  return {"random", desc, num_prompts, lo(input_len), hi(input_len), lo(output_len), hi(output_len), 0};
}

Workload load_dataset_workload(const std::string& path, int64_t default_output_len, const WorkloadOptions& o) {
  KBN_CHECK(o.vocab_size >= 1, "load_dataset_workload: vocab_size must be >= 1, got ", o.vocab_size);
  KBN_CHECK(o.max_model_len >= 2, "load_dataset_workload: max_model_len must be >= 2, got ", o.max_model_len);
  KBN_CHECK(default_output_len >= 1, "--output-len: expected an output length >= 1, got ", default_output_len);
  KBN_CHECK(o.scale > 0 && std::isfinite(o.scale), "--scale: expected a factor > 0, got ", o.scale);
  std::ifstream in(path);
  KBN_CHECK(in.good(), "--dataset: cannot open '", path, "'");
  Workload w;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (o.num_requests > 0 && int64_t(w.requests.size()) == o.num_requests) break;
    const std::string where = "--dataset " + path + " line " + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      KBN_FAIL(where, ": not valid JSON (", e.what(), ")");
    }
    KBN_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
    KBN_CHECK(!j.contains("prompt_token_ids") || !j.contains("prompt"), where,
              ": give 'prompt_token_ids' or 'prompt', not both");
    Request r;
    r.id = int64_t(w.requests.size());
    nlohmann::json ids = j.contains("prompt_token_ids") ? j["prompt_token_ids"] : nlohmann::json();
    if (j.contains("prompt")) {
      KBN_CHECK(j["prompt"].is_string() && !j["prompt"].get<std::string>().empty(), where,
                ": 'prompt' must be a non-empty string");
      KBN_CHECK(bool(o.encode), where,
                ": a text 'prompt' needs the model's tokenizer (its folder's tokenizer.json, or --tokenizer)");
      ids = o.encode(j["prompt"].get<std::string>());
    }
    KBN_CHECK(ids.is_array() && !ids.empty(), where,
              ": expected 'prompt_token_ids' (a non-empty array of token ids) or a text 'prompt'");
    for (const auto& t : ids) {
      KBN_CHECK(t.is_number_integer(), where, ": 'prompt_token_ids' holds ", t.dump(), ", not an integer");
      const int64_t id = t.get<int64_t>();
      KBN_CHECK(id >= 0 && id < o.vocab_size, where, ": token id ", id, " is outside the vocabulary [0, ",
                o.vocab_size, ")");
      r.prompt.push_back(id);
    }
    int64_t out = default_output_len;
    for (const char* key : {"output_len", "max_tokens"}) {
      if (!j.contains(key)) continue;
      KBN_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 1, where, ": '", key,
                "' must be an integer >= 1, got ", j[key].dump());
      out = j[key].get<int64_t>();
    }
    out = scaled(out, o.scale);
    int64_t len = int64_t(r.prompt.size());
    if (len + out > o.max_model_len) {  // as make_workload: keep the output, shorten the prompt
      out = std::min(out, o.max_model_len - 1);
      len = std::min(len, o.max_model_len - out);
      r.prompt.resize(size_t(len));
      ++w.clipped;
    }
    r.sampling.max_tokens = out;
    r.sampling.ignore_eos = true;
    r.sampling.seed = hash_seed(o.seed, ("workload.sampling." + std::to_string(r.id)).c_str());
    w.requests.push_back(std::move(r));
  }
  KBN_CHECK(!w.requests.empty(), "--dataset: '", path, "' holds no request");
  int64_t in_min = INT64_MAX, in_max = 0, out_min = INT64_MAX, out_max = 0;
  for (const auto& r : w.requests) {
    in_min = std::min<int64_t>(in_min, int64_t(r.prompt.size()));
    in_max = std::max<int64_t>(in_max, int64_t(r.prompt.size()));
    out_min = std::min(out_min, r.sampling.max_tokens);
    out_max = std::max(out_max, r.sampling.max_tokens);
  }
  w.spec = {"dataset", std::to_string(w.requests.size()) + " requests from " + path, int64_t(w.requests.size()),
            in_min, in_max, out_min, out_max, 0};
  return w;
}

Workload make_workload(const WorkloadSpec& spec, const WorkloadOptions& o) {
  Workload w;
  w.spec = spec;
  const std::string& name = spec.name;
  KBN_CHECK(o.vocab_size >= 1, "make_workload: vocab_size must be >= 1, got ", o.vocab_size);
  KBN_CHECK(o.max_model_len >= 2, "make_workload: max_model_len must be >= 2, got ", o.max_model_len);
  KBN_CHECK(o.num_requests >= 0, "--num-requests: expected a count >= 1 (0 = the workload's own), got ",
            o.num_requests);
  KBN_CHECK(o.scale > 0 && std::isfinite(o.scale), "--scale: expected a factor > 0, got ", o.scale);
  const int64_t n = o.num_requests > 0 ? o.num_requests : w.spec.num_requests;
  // Independent streams per quantity, so changing the count does not reshuffle the requests kept.
  const uint64_t in_key = hash_seed(o.seed, ("workload.input_len." + name).c_str());
  const uint64_t out_key = hash_seed(o.seed, ("workload.output_len." + name).c_str());
  const uint64_t tok_key = hash_seed(o.seed, ("workload.tokens." + name).c_str());
  w.requests.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t in = scaled(uniform_int(in_key, uint64_t(i), w.spec.input_min, w.spec.input_max), o.scale);
    int64_t out = scaled(uniform_int(out_key, uint64_t(i), w.spec.output_min, w.spec.output_max), o.scale);
    if (in + out > o.max_model_len) {  // keep the output, shorten the prompt (long-context keeps its long prompts)
      out = std::min(out, o.max_model_len - 1);
      in = std::min(in, o.max_model_len - out);
      ++w.clipped;
    }
    Request r;
    r.id = i;
    r.prompt.resize(size_t(in));
    // Token j of request i is draw (i << 32 | j) of the token stream: a pure function of (seed, i, j).
    for (int64_t j = 0; j < in; ++j)
      r.prompt[size_t(j)] = uniform_int(tok_key, (uint64_t(i) << 32) | uint64_t(j), 0, o.vocab_size - 1);
    r.sampling.max_tokens = out;
    r.sampling.ignore_eos = true;
    r.sampling.seed = hash_seed(o.seed, ("workload.sampling." + std::to_string(i)).c_str());
    w.requests.push_back(std::move(r));
  }
  return w;
}

}  // namespace kbn::engine
