#pragma once
// Benchmark cases of the L1 ops, derived from a model's config and a tensor-parallel size: the shapes one
// rank of a vLLM deployment runs, the constructor arguments, a seeded input maker, and exact byte and FLOP
// counts for the roofline (each op carries its own test facts, as ggml's test-backend-ops does).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kbn/config.h"
#include "kbn/forward_context.h"
#include "kbn/registry.h"
#include "kbn/tensor.h"

namespace kbn::bench {

// What an attention-bearing block (L2 llama_attention, L3 llama_decoder_layer) reads from the forward
// context: one step's metadata and a one-layer paged KV cache holding the sequences' earlier tokens.
struct StepContext {
  AttentionMetadata metadata;
  std::vector<KVCache> kv_caches;
};

struct BenchCase {
  std::string op;     // registry name, e.g. "rms_norm"
  std::string model;  // models/ name, e.g. "llama-3.1-8b-instruct"
  int64_t tp = 1;
  int64_t tokens = 0;  // the --tokens value that reproduces this case (batch size for decode attention)
  std::string label;   // unique within (op, model, tp), e.g. "T=4096 H=4096"
  OpArgs args;         // constructor arguments; the caller sets args.opts (dtype, device) before make()
  DType dtype = DType::bf16;
  // The forward's tensors in OpEntry::args order, on `device`, drawn from `seed`: activations N(0, 1),
  // weights N(0, 0.02), ids uniform in the rank's vocabulary shard, positions < max_position_embeddings,
  // slot mappings and block tables from a seeded permutation of the cache's slots/blocks.
  std::function<std::vector<Tensor>(Device device, uint64_t seed)> make_inputs;
  int64_t bytes = 0;  // DRAM traffic of an ideal kernel: each input element read once, each output written once
  int64_t flops = 0;
  int64_t input_bytes = 0;       // bytes of one input set as allocated (for sizing the cold-L2 rotation)
  int64_t output_numel = 0;      // elements of all outputs (gates the CPU correctness check)
  bool graph_capturable = true;  // false when a call does host work a CUDA graph cannot hold
  std::string note;              // a caveat stamped on the result row (e.g. host work inside the timed call)
  // L2/L3 cases: the model config the op is built from (args.config points into it), and, for ops that
  // contain attention, the forward context every call must run under (same seed: same cache contents on
  // any device).
  std::shared_ptr<const ModelConfig> model_config;
  std::function<std::shared_ptr<StepContext>(Device device, uint64_t seed)> make_context;
};

struct CaseOptions {
  std::vector<int64_t> tokens;  // empty: the op's default token counts
  DType dtype = DType::bf16;
};

// The L1 ops of a Llama model that `kb_nano kernels` times, in model order (all_reduce needs a TP group
// of processes and is not among them).
const std::vector<std::string>& llama_l1_ops();

// NOTE: decode token counts cover CUDA-graph batch sizes; prefill ones cover chunked-prefill budgets up to
// a 16k single prompt.
const std::vector<int64_t>& decode_token_counts();        // {1, 8, 32, 64, 128, 256}
const std::vector<int64_t>& prefill_token_counts();       // {512, ..., 16384}
const std::vector<int64_t>& decode_attention_batches();   // {1, 8, 32, 64, 128}
const std::vector<int64_t>& decode_attention_contexts();  // {1024, 4096, 8192}

// Cases of `op` for one rank of a `tp`-way tensor-parallel `model`. Errors name the flag (--target,
// --tp, --tokens) and what was expected.
std::vector<BenchCase> cases_for(const std::string& op, const std::string& model, const LlamaConfig& config, int64_t tp,
                                 const CaseOptions& options);

// Property-based shapes (DESIGN.md: "plus property-based random shapes"): `count` random Llama-like configs
// derived from `like` (odd hidden and intermediate sizes, 1..16 query heads per kv head, head size 64 or 128,
// vocabularies that are not multiples of 64), each with one random token count, all drawn from `seed`.
// Labels start with "random#i". `small` keeps them cheap enough for CPU ops and the CPU oracle.
std::vector<BenchCase> random_cases(const std::string& op, const ModelConfig& like, int count, uint64_t seed,
                                    bool small, DType dtype);

// The L2 and L3 ops of a Llama layer that `kb_nano kernels --level 2|3` validates and times (tp = 1).
const std::vector<std::string>& llama_block_ops(int level);
// Cases of an L2/L3 op: each token count T <= 256 is a decode step (T sequences with 1024 cached tokens each,
// one new token), larger T a prefill step (sequences of at most 4096 new tokens, nothing cached).
std::vector<BenchCase> block_cases_for(const std::string& op, const std::string& model, const ModelConfig& config,
                                       const CaseOptions& options);
const std::vector<int64_t>& block_token_counts();  // {1, 32, 128, 512, 4096}

// One line per case: op, model, tp, label, bytes, FLOPs (what `kb_nano kernels --list` prints).
std::string format_case_list(const std::vector<BenchCase>& cases);

}  // namespace kbn::bench
