#include "engine/workloads.h"

#include <algorithm>
#include <cmath>

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

Workload make_workload(const std::string& name, const WorkloadOptions& o) {
  Workload w;
  w.spec = workload_spec(name);
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
