#pragma once
// One benchmark/validation case of an op: the shapes one rank of a deployment runs, the constructor
// arguments, a seeded input maker and exact byte and FLOP counts (ggml's test-backend-ops keeps these with
// the op; here each op's facts file in tasks/ops/ builds them from a ModelView). Also the helpers those facts
// files share: seeded inputs, the default token counts, and the one-step forward context of attention blocks.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kbn/forward_context.h"
#include "kbn/model_view.h"
#include "kbn/op_args.h"
#include "kbn/tensor.h"

namespace kbn {

// What an attention-bearing block reads from the forward context: one step's metadata and a one-layer paged
// KV cache holding the sequences' earlier tokens.
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
  // The KV pages' dtype when the case reads or writes a paged cache of another dtype than `dtype` (kernels
  // --kv-cache-dtype fp8_e4m3); empty for every other case.
  std::optional<DType> kv_cache_dtype;
  // The forward's tensors in OpEntry::args order, on `device`, drawn from `seed`: activations N(0, 1),
  // weights N(0, 0.02), ids uniform in the rank's vocabulary shard, positions < max_position_embeddings,
  // slot mappings and block tables from a seeded permutation of the cache's slots/blocks.
  std::function<std::vector<Tensor>(Device device, uint64_t seed)> make_inputs;
  int64_t bytes = 0;  // DRAM traffic of an ideal kernel: each input element read once, each output written once
  int64_t flops = 0;
  int64_t input_bytes = 0;       // bytes of one input set as allocated (for sizing the cold-L2 rotation)
  int64_t output_numel = 0;      // elements of all outputs (gates the CPU correctness check)
  bool graph_capturable = true;  // false when a call does host work a CUDA graph cannot hold
  // {m, n, k} when the case is one GEMM out[m, n] = x[m, k] w[n, k]^T: `kb_nano kernels` then measures the roofline
  // of that very shape (the fastest cuBLASLt algorithm on it) instead of using the 8192^3 rate.
  std::optional<std::array<int64_t, 3>> gemm;
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
  bool random = false;  // a random-shape case (one random token count in `tokens`)
  bool small = false;   // sized for CPU ops and the CPU oracle
  // The paged KV cache's dtype where it is not `dtype` (kernels --kv-cache-dtype fp8_e4m3): the attention ops that
  // read pages and store_kvcache honour it (with kFp8KScale / kFp8VScale) and set BenchCase::kv_cache_dtype; the
  // others ignore it.
  std::optional<DType> kv_cache_dtype;
};

namespace cases {

// NOTE: decode token counts cover CUDA-graph batch sizes; prefill ones cover chunked-prefill budgets up to
// a 16k single prompt.
const std::vector<int64_t>& decode_token_counts();        // {1, 8, 32, 64, 128, 256}
const std::vector<int64_t>& prefill_token_counts();       // {512, ..., 16384}
const std::vector<int64_t>& decode_attention_batches();   // {1, 8, 32, 64, 128}
const std::vector<int64_t>& decode_attention_contexts();  // {1024, 4096, 8192}
const std::vector<int64_t>& block_token_counts();         // {1, 32, 128, 512, 4096}
// options.tokens when given, else decode then prefill counts.
std::vector<int64_t> token_counts(const CaseOptions& options);

constexpr int64_t kKvBlockSize = 16;        // the engine's default paged-KV block size
constexpr int64_t kPrefillSequence = 4096;  // long prefills are also timed as batches of sequences this long
constexpr double kWeightStd = 0.02;         // initializer_range of the real configs
constexpr int64_t kDecodeContext = 1024;    // cached tokens per sequence in a block decode case
constexpr int64_t kDecodeMaxTokens = 256;   // blocks: larger token counts are prefill steps
// The per-tensor scales (args k_scale, v_scale) the fp8-page cases of the attention ops and store_kvcache run with:
// a calibrated checkpoint's, not 1.0, so a kernel that ignores them fails validation.
constexpr double kFp8KScale = 1.25, kFp8VScale = 0.75;
// A case of an op that reads or writes paged K/V under `options`: its pages' dtype and, for fp8 pages, the scales.
void set_kv_pages(BenchCase& b, const CaseOptions& options);

int64_t ceil_div(int64_t a, int64_t b);
std::string str(int64_t v);

// A case with the common fields filled (op, model, tp, tokens, dtype).
BenchCase base(const std::string& op, const ModelView& m, int64_t tokens, DType dtype);

// Seeded inputs: each tensor draws from (seed, name), so every device and variant sees the same values.
Tensor normal(const Shape& shape, DType dtype, Device device, uint64_t seed, const char* name, double std);
Tensor randint(const Shape& shape, DType dtype, Device device, uint64_t seed, const char* name, int64_t lo,
               int64_t hi);
// The first numel(shape) entries of a seeded permutation of [0, total), as i32 or i64: distinct cache slots
// (store_kvcache) or distinct blocks scattered over the cache (block tables).
Tensor permutation_prefix(int64_t total, const Shape& shape, DType dtype, Device device, uint64_t seed,
                          const char* name);
Tensor filled_i32(const std::vector<int32_t>& values, Device device);
// The cached lengths of a random decode case's B sequences: the first holds all ctx keys (so max_seq_len = ctx is
// exact), the others 1..ctx, fixed by (B, ctx) so that the case's bytes and FLOPs are exact, and unequal, so that a
// kernel which reads max_seq_len keys, or one sequence's length, for every sequence fails the oracle.
std::vector<int32_t> ragged_lengths(int64_t B, int64_t ctx);
// A random prefill case's T new tokens as up to 3 sequences of unequal query lengths (each >= 1, summing to T), each
// after a cached prefix of 0..its query length (chunked prefill: seq_len = cached + query), fixed by T: a kernel that
// treats the batch as one sequence, or assumes no cached keys, fails the oracle.
struct RaggedPrefill {
  std::vector<int32_t> query, cached;
};
RaggedPrefill ragged_prefill(int64_t T);

// Expert routings of the MoE cases: each token's top_k distinct experts, drawn from (seed, name).
//   uniform: every expert equally likely.
//   skewed:  Zipf-like, a few hot experts: the expert of popularity rank r (ranks a seeded permutation of the
//            experts) is drawn with weight 1 / (r + 1)^1.2, without replacement within a token.
enum class Routing { uniform, skewed };
const char* routing_name(Routing routing);
// topk_ids [tokens, top_k] i32.
Tensor routing_ids(int64_t tokens, int64_t top_k, int64_t num_experts, Routing routing, Device device, uint64_t seed,
                   const char* name);
// topk_weights [tokens, top_k] f32: positive, each row summing to 1, best first (as a renormalised router's).
Tensor routing_weights(int64_t tokens, int64_t top_k, Device device, uint64_t seed, const char* name);

// The attention variants a model's layers run, for the attention ops' cases: full causal attention always, and
// the model's sliding window (its own cases) when some layers slide; with sinks (gpt-oss) each variant has them
// (a sinks case's input list ends with the f32 sinks [num_heads], N(0, 1)), and the full variant is also timed
// without them so that the cost of sinks shows side by side.
struct AttentionVariant {
  int64_t window = 0;  // 0: none
  bool sinks = false;
  std::string label() const;  // "" / " window=128" / " sinks" / " window=128 sinks"
};
std::vector<AttentionVariant> attention_variants(const AttentionShape& a);
// Causal query-key pairs of one sequence of L new tokens after `cached` earlier keys, each query seeing at most
// `window` keys (0: no window).
int64_t attention_pairs(int64_t L, int64_t cached, int64_t window);

// One step's sequences for a block case: T <= kDecodeMaxTokens is a decode step (T sequences with
// kDecodeContext cached tokens, one new token each), larger T a prefill step (sequences of at most
// kPrefillSequence new tokens, nothing cached). Prefills first, as the metadata wants.
struct StepShape {
  bool decode = false;
  std::vector<int64_t> query, cached;
  int64_t tokens() const;
  std::vector<int64_t> positions() const;  // of the step's new tokens, sequence by sequence
  std::string label() const;               // "decode B=32 ctx=1024" / "prefill T=4096"
};
StepShape step_shape(int64_t T, int64_t max_positions);
// The step's metadata and a one-layer paged KV cache (random cached K/V, blocks scattered by a seeded
// permutation) for kv_heads x head_dim.
std::shared_ptr<StepContext> make_step_context(const StepShape& st, int64_t kv_heads, int64_t head_dim, DType dt,
                                               Device d, uint64_t seed);

// The step's metadata with a state slot per sequence (a seeded permutation of num_seqs + 3 slots; decode sequences
// have an initial state, prefill ones start from zero) and a one-layer state cache of `state_shapes` (random states,
// N(0, 1), in every slot), for the recurrent-state blocks (MambaMixer2).
std::shared_ptr<StepContext> make_state_step_context(const StepShape& st, const std::vector<Shape>& state_shapes,
                                                     DType dt, Device d, uint64_t seed);

// The facts of an L2/L3 block that the generic block cases need (bytes and FLOPs of an ideal fused block:
// every weight read once, the step's activations in and out, and, with attention, the cached K/V read).
struct BlockFacts {
  int64_t params = 0;        // weight elements read once per call
  int64_t in_features = 0;   // per token, of each activation input
  int64_t out_features = 0;  // per token, of each output
  bool attention = false;    // forward(positions, hidden_states[, residual]) under a step context
  bool residual = false;     // decoder layers: (hidden_states, residual) in and out
  // Recurrent-state blocks: forward(hidden_states[, residual]) under a step context with a state cache of these
  // shapes (one layer, the block's dtype); the states of the step's sequences are read (decode) and written.
  std::vector<Shape> state_shapes;
  bool residual_f32 = false;  // the residual input is f32 (Mamba-2's residual_in_fp32)
};
// One case per token count (options.tokens, else block_token_counts()) of the block `op` built from the
// view's config (tp 1 only; errors name --tp).
std::vector<BenchCase> block_cases(const std::string& op, const ModelView& m, const CaseOptions& options,
                                   const BlockFacts& facts);

}  // namespace cases
}  // namespace kbn
