#include "bench/cases.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "kbn/error.h"
#include "kbn/rng.h"

namespace kbn::bench {
namespace {

constexpr int64_t kKvBlockSize = 16;        // the engine's default paged-KV block size
constexpr int64_t kPrefillSequence = 4096;  // long prefills are also timed as batches of sequences this long
constexpr double kWeightStd = 0.02;         // initializer_range of the Llama configs

Tensor normal(const Shape& shape, DType dtype, Device device, uint64_t seed, const char* name, double std) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_normal_(t, hash_seed(seed, name), 0.0, std);
  return t;
}

Tensor randint(const Shape& shape, DType dtype, Device device, uint64_t seed, const char* name, int64_t lo,
               int64_t hi) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_randint_(t, hash_seed(seed, name), lo, hi);
  return t;
}

// The first `count` entries of a seeded permutation of [0, total), as an i32 or i64 tensor of `shape`:
// distinct cache slots (store_kvcache) or distinct blocks scattered over the cache (block tables).
Tensor permutation_prefix(int64_t total, const Shape& shape, DType dtype, Device device, uint64_t seed,
                          const char* name) {
  const int64_t count = shape_numel(shape);
  KBN_CHECK(count <= total, "bench: permutation of ", total, " values cannot fill ", count, " entries");
  std::vector<int64_t> values(static_cast<size_t>(total));
  std::iota(values.begin(), values.end(), int64_t(0));
  std::mt19937_64 gen(hash_seed(seed, name));
  std::shuffle(values.begin(), values.end(), gen);
  values.resize(size_t(count));
  if (dtype == DType::i64) return Tensor::from_i64(values, shape).to(device);
  std::vector<int32_t> narrow(values.begin(), values.end());
  return Tensor::from_i32(narrow, shape).to(device);
}

Tensor filled_i32(const std::vector<int32_t>& values, Device device) {
  return Tensor::from_i32(values, {int64_t(values.size())}).to(device);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per-rank sizes of a tp-way Llama, split where vLLM splits them.
struct RankShapes {
  int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab, vocab_full, max_positions;
  double eps;
};

RankShapes rank_shapes(const LlamaConfig& c, int64_t tp) {
  KBN_CHECK(tp >= 1, "--tp: expected a positive tensor-parallel size, got ", tp);
  KBN_CHECK(c.num_attention_heads % tp == 0, "--tp: ", tp,
            " does not divide num_attention_heads = ", c.num_attention_heads);
  KBN_CHECK(c.intermediate_size % tp == 0, "--tp: ", tp, " does not divide intermediate_size = ", c.intermediate_size);
  // NOTE: like vLLM's QKVParallelLinear, fewer kv heads than ranks means each rank holds one replicated head.
  KBN_CHECK(c.num_key_value_heads % tp == 0 || tp % c.num_key_value_heads == 0, "--tp: ", tp,
            " must divide num_key_value_heads = ", c.num_key_value_heads, " or be a multiple of it");
  RankShapes s;
  s.hidden = c.hidden_size;
  s.intermediate = c.intermediate_size / tp;
  s.heads = c.num_attention_heads / tp;
  s.kv_heads = std::max<int64_t>(1, c.num_key_value_heads / tp);
  s.head_dim = c.head_dim;
  // NOTE: vLLM pads the vocabulary to a multiple of 64 before splitting; the Llama-3 vocabularies already are.
  s.vocab = ceil_div(c.vocab_size, tp);
  s.vocab_full = c.vocab_size;
  s.max_positions = c.max_position_embeddings;
  s.eps = c.rms_norm_eps;
  return s;
}

std::string str(int64_t v) { return std::to_string(v); }

BenchCase base_case(const std::string& op, const std::string& model, int64_t tp, int64_t tokens, DType dtype) {
  BenchCase b;
  b.op = op;
  b.model = model;
  b.tp = tp;
  b.tokens = tokens;
  b.dtype = dtype;
  b.args.op = op;
  return b;
}

void add_norm_cases(std::vector<BenchCase>& out, const std::string& op, const std::string& model, int64_t tp,
                    const RankShapes& s, const std::vector<int64_t>& tokens, DType dt) {
  const bool fused = op == "fused_add_rms_norm";
  const int64_t es = int64_t(dtype_size(dt)), H = s.hidden;
  for (int64_t T : tokens) {
    BenchCase b = base_case(op, model, tp, T, dt);
    b.label = "T=" + str(T) + " H=" + str(H);
    b.args.values = {{"hidden_size", double(H)}, {"eps", s.eps}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      std::vector<Tensor> in{normal({T, H}, dt, d, seed, "x", 1.0)};
      if (fused) in.push_back(normal({T, H}, dt, d, seed, "residual", 1.0));
      return in;
    };
    // x [T, H] (+ residual [T, H]) read, out (fused: x and residual) written, weight [H] read once.
    const int64_t buffers = fused ? 4 : 2;
    b.bytes = buffers * T * H * es + H * es;
    b.flops = (fused ? 5 : 4) * T * H;
    b.input_bytes = (fused ? 2 : 1) * T * H * es;
    b.output_numel = (fused ? 2 : 1) * T * H;
    out.push_back(std::move(b));
  }
}

void add_silu_and_mul_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                            const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), I = s.intermediate;
  for (int64_t T : tokens) {
    BenchCase b = base_case("silu_and_mul", model, tp, T, dt);
    b.label = "T=" + str(T) + " I=" + str(I);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{normal({T, 2 * I}, dt, d, seed, "x", 1.0)};
    };
    b.bytes = 3 * T * I * es;  // x [T, 2I] read, out [T, I] written
    b.flops = 5 * T * I;       // silu (exp, add, divide, multiply) and the product
    b.input_bytes = 2 * T * I * es;
    b.output_numel = T * I;
    out.push_back(std::move(b));
  }
}

void add_rotary_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const LlamaConfig& c,
                      const RankShapes& s, const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), D = s.head_dim, Hq = s.heads, Hk = s.kv_heads;
  const int64_t max_pos = s.max_positions;
  for (int64_t T : tokens) {
    BenchCase b = base_case("rotary_embedding", model, tp, T, dt);
    b.label = "T=" + str(T) + " heads=" + str(Hq) + " kv=" + str(Hk) + " D=" + str(D);
    b.args.values = {{"head_size", double(D)},
                     {"rotary_dim", double(D)},
                     {"max_position_embeddings", double(max_pos)},
                     {"base", c.rope_theta},
                     {"is_neox_style", 1.0}};
    if (c.rope_scaling.rope_type == "llama3") {
      b.args.values["rope_factor"] = c.rope_scaling.factor;
      b.args.values["rope_low_freq_factor"] = c.rope_scaling.low_freq_factor;
      b.args.values["rope_high_freq_factor"] = c.rope_scaling.high_freq_factor;
      b.args.values["rope_original_max_position_embeddings"] = double(c.rope_scaling.original_max_position_embeddings);
    }
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{randint({T}, DType::i64, d, seed, "positions", 0, max_pos),
                                 normal({T, Hq * D}, dt, d, seed, "query", 1.0),
                                 normal({T, Hk * D}, dt, d, seed, "key", 1.0)};
    };
    // positions [T] i64 read; query and key read and written in place; one cos|sin row [D] per token.
    b.bytes = T * 8 + 2 * T * (Hq + Hk) * D * es + T * D * es;
    b.flops = 3 * T * (Hq + Hk) * D;  // per rotated pair: 4 multiplies, 2 adds
    b.input_bytes = T * 8 + T * (Hq + Hk) * D * es;
    b.output_numel = T * (Hq + Hk) * D;
    out.push_back(std::move(b));
  }
}

void add_embedding_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                         const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), H = s.hidden, V = s.vocab;
  for (int64_t T : tokens) {
    BenchCase b = base_case("embedding", model, tp, T, dt);
    b.label = "T=" + str(T) + " V=" + str(V) + " H=" + str(H);
    // NOTE: ids stay inside this rank's shard: the registry adapter passes the whole weight as the shard.
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{randint({T}, DType::i64, d, seed, "input_ids", 0, V),
                                 normal({V, H}, dt, d, seed, "weight", kWeightStd)};
    };
    b.bytes = T * 8 + 2 * T * H * es;  // ids read, the T gathered rows read (not the whole table), out written
    b.flops = 0;
    b.input_bytes = T * 8 + V * H * es;
    b.output_numel = T * H;
    out.push_back(std::move(b));
  }
}

void add_linear_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                      const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt));
  struct Gemm {
    const char* name;
    int64_t n, k;
  };
  const std::vector<Gemm> gemms = {
      {"qkv", (s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden},
      {"o", s.hidden, s.heads * s.head_dim},
      {"gate_up", 2 * s.intermediate, s.hidden},
      {"down", s.hidden, s.intermediate},
      {"lm_head", s.vocab, s.hidden},
  };
  for (const Gemm& g : gemms) {
    for (int64_t T : tokens) {
      const int64_t N = g.n, K = g.k;
      BenchCase b = base_case("linear", model, tp, T, dt);
      b.label = std::string(g.name) + " T=" + str(T) + " N=" + str(N) + " K=" + str(K);
      b.make_inputs = [=](Device d, uint64_t seed) {
        return std::vector<Tensor>{normal({T, K}, dt, d, seed, "x", 1.0),
                                   normal({N, K}, dt, d, seed, "weight", kWeightStd), Tensor()};  // Llama has no bias
      };
      b.bytes = (T * K + N * K + T * N) * es;
      b.flops = 2 * T * N * K;
      b.input_bytes = (T * K + N * K) * es;
      b.output_numel = T * N;
      out.push_back(std::move(b));
    }
  }
}

void add_store_kvcache_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                             const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), Hk = s.kv_heads, D = s.head_dim;
  for (int64_t T : tokens) {
    const int64_t blocks = ceil_div(T, kKvBlockSize);
    BenchCase b = base_case("store_kvcache", model, tp, T, dt);
    b.label = "T=" + str(T) + " kv=" + str(Hk) + " D=" + str(D) + " blocks=" + str(blocks);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{normal({T, Hk, D}, dt, d, seed, "key", 1.0),
                                 normal({T, Hk, D}, dt, d, seed, "value", 1.0),
                                 normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "key_cache", 1.0),
                                 normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "value_cache", 1.0),
                                 permutation_prefix(blocks * kKvBlockSize, {T}, DType::i64, d, seed, "slot_mapping")};
    };
    // key, value [T, kv, D] and slot_mapping [T] i64 read; T rows written into each cache (the rest untouched).
    b.bytes = 4 * T * Hk * D * es + T * 8;
    b.flops = 0;
    b.input_bytes = 2 * T * Hk * D * es + 2 * blocks * kKvBlockSize * Hk * D * es + T * 8;
    b.output_numel = 2 * blocks * kKvBlockSize * Hk * D;
    out.push_back(std::move(b));
  }
}

// NOTE: the launch maxima are host facts of the case, passed as constructor arguments so the registry adapter
// does no device-to-host read inside the timed call (and the call can be captured in a CUDA graph).
void set_attention_args(BenchCase& b, const RankShapes& s, int64_t max_query_len, int64_t max_seq_len) {
  b.args.values = {{"num_heads", double(s.heads)},
                   {"head_size", double(s.head_dim)},
                   {"scale", 1.0 / std::sqrt(double(s.head_dim))},
                   {"num_kv_heads", double(s.kv_heads)},
                   {"max_query_len", double(max_query_len)},
                   {"max_seq_len", double(max_seq_len)}};
}

void add_prefill_attention_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                                 const std::vector<int64_t>& tokens, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), Hq = s.heads, Hk = s.kv_heads, D = s.head_dim;
  for (int64_t T : tokens) {
    std::vector<int64_t> seq_counts{1};
    if (T > kPrefillSequence && T % kPrefillSequence == 0) seq_counts.push_back(T / kPrefillSequence);
    for (int64_t seqs : seq_counts) {
      const int64_t L = T / seqs, blocks_per_seq = ceil_div(L, kKvBlockSize), blocks = seqs * blocks_per_seq;
      BenchCase b = base_case("flash_attn_prefill", model, tp, T, dt);
      b.label = "seqs=" + str(seqs) + "x" + str(L) + " heads=" + str(Hq) + " kv=" + str(Hk) + " D=" + str(D);
      set_attention_args(b, s, L, L);
      b.make_inputs = [=](Device d, uint64_t seed) {
        std::vector<int32_t> starts(static_cast<size_t>(seqs + 1));
        const std::vector<int32_t> lens(static_cast<size_t>(seqs), static_cast<int32_t>(L));
        for (int64_t i = 0; i <= seqs; ++i) starts[size_t(i)] = int32_t(i * L);
        // The new keys are already in the cache (stored by store_kvcache before attention runs).
        return std::vector<Tensor>{
            normal({T, Hq, D}, dt, d, seed, "q", 1.0),
            normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "key_cache", 1.0),
            normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "value_cache", 1.0),
            filled_i32(starts, d),
            filled_i32(lens, d),
            permutation_prefix(blocks, {seqs, blocks_per_seq}, DType::i32, d, seed, "block_tables")};
      };
      const int64_t metadata = (seqs + 1) * 4 + seqs * 4 + seqs * blocks_per_seq * 4;
      // q read, out written, each sequence's keys and values read once, metadata read.
      b.bytes = 2 * T * Hq * D * es + 2 * seqs * L * Hk * D * es + metadata;
      b.flops = 4 * Hq * D * seqs * (L * (L + 1) / 2);  // QK^T and PV over the causal pairs
      b.input_bytes = T * Hq * D * es + 2 * blocks * kKvBlockSize * Hk * D * es + metadata;
      b.output_numel = T * Hq * D;
      out.push_back(std::move(b));
    }
  }
}

void add_decode_attention_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                                const std::vector<int64_t>& batches, DType dt) {
  const int64_t es = int64_t(dtype_size(dt)), Hq = s.heads, Hk = s.kv_heads, D = s.head_dim;
  for (int64_t B : batches) {
    for (int64_t ctx : decode_attention_contexts()) {
      const int64_t blocks_per_seq = ceil_div(ctx, kKvBlockSize), blocks = B * blocks_per_seq;
      BenchCase b = base_case("flash_attn_decode", model, tp, B, dt);
      b.label = "B=" + str(B) + " ctx=" + str(ctx) + " heads=" + str(Hq) + " kv=" + str(Hk) + " D=" + str(D);
      set_attention_args(b, s, 1, ctx);
      b.make_inputs = [=](Device d, uint64_t seed) {
        return std::vector<Tensor>{
            normal({B, Hq, D}, dt, d, seed, "q", 1.0),
            normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "key_cache", 1.0),
            normal({blocks, kKvBlockSize, Hk, D}, dt, d, seed, "value_cache", 1.0),
            filled_i32(std::vector<int32_t>(size_t(B), int32_t(ctx)), d),
            permutation_prefix(blocks, {B, blocks_per_seq}, DType::i32, d, seed, "block_tables")};
      };
      const int64_t metadata = B * 4 + B * blocks_per_seq * 4;
      // The K/V read dominates: every sequence's ctx keys and values once; plus q read, out written.
      b.bytes = 2 * B * ctx * Hk * D * es + 2 * B * Hq * D * es + metadata;
      b.flops = 4 * Hq * D * B * ctx;
      b.input_bytes = B * Hq * D * es + 2 * blocks * kKvBlockSize * Hk * D * es + metadata;
      b.output_numel = B * Hq * D;
      out.push_back(std::move(b));
    }
  }
}

void add_argmax_cases(std::vector<BenchCase>& out, const std::string& model, int64_t tp, const RankShapes& s,
                      const std::vector<int64_t>& tokens, DType dt) {
  // NOTE: the sampler sees the full vocabulary (logits are gathered across ranks), so V is not split.
  const int64_t es = int64_t(dtype_size(dt)), V = s.vocab_full;
  for (int64_t T : tokens) {
    BenchCase b = base_case("argmax", model, tp, T, dt);
    b.label = "T=" + str(T) + " V=" + str(V);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{normal({T, V}, dt, d, seed, "logits", 1.0)};
    };
    b.bytes = T * V * es + T * 8;  // logits read, i64 indices written
    b.flops = T * V;               // one comparison per logit
    b.input_bytes = T * V * es;
    b.output_numel = T;
    out.push_back(std::move(b));
  }
}

}  // namespace

const std::vector<std::string>& llama_l1_ops() {
  static const std::vector<std::string> ops = {
      "embedding",     "rms_norm",           "fused_add_rms_norm", "linear",       "rotary_embedding",
      "store_kvcache", "flash_attn_prefill", "flash_attn_decode",  "silu_and_mul", "argmax"};
  return ops;
}

const std::vector<int64_t>& decode_token_counts() {
  static const std::vector<int64_t> v = {1, 8, 32, 64, 128, 256};
  return v;
}
const std::vector<int64_t>& prefill_token_counts() {
  static const std::vector<int64_t> v = {512, 1024, 2048, 4096, 8192, 16384};
  return v;
}
const std::vector<int64_t>& decode_attention_batches() {
  static const std::vector<int64_t> v = {1, 8, 32, 64, 128};
  return v;
}
const std::vector<int64_t>& decode_attention_contexts() {
  static const std::vector<int64_t> v = {1024, 4096, 8192};
  return v;
}

std::vector<BenchCase> cases_for(const std::string& op, const std::string& model, const LlamaConfig& config, int64_t tp,
                                 const CaseOptions& options) {
  const auto& ops = llama_l1_ops();
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) {
    std::string known;
    for (const auto& o : ops) known += (known.empty() ? "" : ", ") + o;
    KBN_FAIL("--target: '", op, "' is not a benchmarked Llama L1 op; expected one of ", known);
  }
  for (int64_t t : options.tokens) KBN_CHECK(t > 0, "--tokens: expected positive token counts, got ", t);
  const RankShapes s = rank_shapes(config, tp);
  const DType dt = options.dtype;
  KBN_CHECK(dt == DType::bf16 || dt == DType::f16 || dt == DType::f32, "--dtype: expected bf16, f16 or f32, got ",
            dtype_name(dt));

  std::vector<int64_t> tokens = options.tokens;
  if (tokens.empty()) {
    if (op == "flash_attn_prefill") {
      tokens = prefill_token_counts();
    } else if (op == "flash_attn_decode") {
      tokens = decode_attention_batches();
    } else {
      tokens = decode_token_counts();
      tokens.insert(tokens.end(), prefill_token_counts().begin(), prefill_token_counts().end());
    }
  }

  std::vector<BenchCase> out;
  if (op == "rms_norm" || op == "fused_add_rms_norm")
    add_norm_cases(out, op, model, tp, s, tokens, dt);
  else if (op == "silu_and_mul")
    add_silu_and_mul_cases(out, model, tp, s, tokens, dt);
  else if (op == "rotary_embedding")
    add_rotary_cases(out, model, tp, config, s, tokens, dt);
  else if (op == "embedding")
    add_embedding_cases(out, model, tp, s, tokens, dt);
  else if (op == "linear")
    add_linear_cases(out, model, tp, s, tokens, dt);
  else if (op == "store_kvcache")
    add_store_kvcache_cases(out, model, tp, s, tokens, dt);
  else if (op == "flash_attn_prefill")
    add_prefill_attention_cases(out, model, tp, s, tokens, dt);
  else if (op == "flash_attn_decode")
    add_decode_attention_cases(out, model, tp, s, tokens, dt);
  else if (op == "argmax")
    add_argmax_cases(out, model, tp, s, tokens, dt);
  else
    KBN_FAIL("bench: no case builder for op '", op, "'");
  return out;
}

const std::vector<std::string>& llama_block_ops(int level) {
  static const std::vector<std::string> l2 = {"qkv_parallel_linear", "merged_column_parallel_linear",
                                              "row_parallel_linear", "llama_attention", "llama_mlp"};
  static const std::vector<std::string> l3 = {"llama_decoder_layer"};
  KBN_CHECK(level == 2 || level == 3, "--level: blocks are level 2 or 3, got ", level);
  return level == 2 ? l2 : l3;
}

const std::vector<int64_t>& block_token_counts() {
  static const std::vector<int64_t> v = {1, 32, 128, 512, 4096};
  return v;
}

namespace {

constexpr int64_t kDecodeContext = 1024;  // cached tokens per sequence in a block decode case
constexpr int64_t kDecodeMaxTokens = 256;

// One step's sequences: query length and cached tokens per sequence (prefills first, as the metadata wants).
struct StepShape {
  bool decode = false;
  std::vector<int64_t> query, cached;
  int64_t tokens() const {
    int64_t t = 0;
    for (int64_t q : query) t += q;
    return t;
  }
};

StepShape step_shape(int64_t T, int64_t max_positions) {
  StepShape st;
  st.decode = T <= kDecodeMaxTokens;
  if (st.decode) {
    const int64_t ctx = std::min(kDecodeContext, max_positions - 1);
    st.query.assign(size_t(T), 1);
    st.cached.assign(size_t(T), ctx);
  } else {
    for (int64_t left = T; left > 0; left -= kPrefillSequence) {
      st.query.push_back(std::min(left, kPrefillSequence));
      st.cached.push_back(0);
    }
  }
  return st;
}

// Positions of the step's new tokens, sequence by sequence.
std::vector<int64_t> step_positions(const StepShape& st) {
  std::vector<int64_t> pos;
  for (size_t i = 0; i < st.query.size(); ++i)
    for (int64_t j = 0; j < st.query[i]; ++j) pos.push_back(st.cached[i] + j);
  return pos;
}

std::shared_ptr<StepContext> make_step_context(const StepShape& st, int64_t kv_heads, int64_t head_dim, DType dt,
                                               Device d, uint64_t seed) {
  const int64_t seqs = int64_t(st.query.size());
  int64_t max_len = 0, max_q = 0;
  for (int64_t i = 0; i < seqs; ++i) {
    max_len = std::max(max_len, st.cached[size_t(i)] + st.query[size_t(i)]);
    max_q = std::max(max_q, st.query[size_t(i)]);
  }
  const int64_t bps = ceil_div(max_len, kKvBlockSize), blocks = seqs * bps;
  // Blocks scattered over the cache from a seeded permutation, as a long-running server's would be.
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 gen(hash_seed(seed, "block_tables"));
  std::shuffle(table.begin(), table.end(), gen);
  std::vector<int64_t> slots;
  std::vector<int32_t> qsl{0}, seq_lens;
  for (int64_t i = 0; i < seqs; ++i) {
    for (int64_t j = 0; j < st.query[size_t(i)]; ++j) {
      const int64_t p = st.cached[size_t(i)] + j;
      slots.push_back(int64_t(table[size_t(i * bps + p / kKvBlockSize)]) * kKvBlockSize + p % kKvBlockSize);
    }
    if (!st.decode) qsl.push_back(qsl.back() + int32_t(st.query[size_t(i)]));
    seq_lens.push_back(int32_t(st.cached[size_t(i)] + st.query[size_t(i)]));
  }
  auto ctx = std::make_shared<StepContext>();
  AttentionMetadata& md = ctx->metadata;
  md.num_prefills = st.decode ? 0 : seqs;
  md.num_prefill_tokens = st.decode ? 0 : st.tokens();
  md.num_decodes = st.decode ? seqs : 0;
  md.slot_mapping = Tensor::from_i64(slots, {int64_t(slots.size())}).to(d);
  md.query_start_loc = Tensor::from_i32(qsl, {int64_t(qsl.size())}).to(d);
  md.seq_lens = Tensor::from_i32(seq_lens, {seqs}).to(d);
  md.block_tables = Tensor::from_i32(table, {seqs, bps}).to(d);
  md.max_prefill_query_len = st.decode ? 0 : max_q;
  md.max_prefill_seq_len = st.decode ? 0 : max_len;
  md.max_decode_seq_len = st.decode ? max_len : 0;
  // The cached tokens' K and V: random, like any earlier step's output; the step writes its own slots.
  ctx->kv_caches.push_back({normal({blocks, kKvBlockSize, kv_heads, head_dim}, dt, d, seed, "key_cache", 1.0),
                            normal({blocks, kKvBlockSize, kv_heads, head_dim}, dt, d, seed, "value_cache", 1.0)});
  return ctx;
}

// A model config with the shape keys of `c` written over `base`'s (random block shapes keep everything else).
std::shared_ptr<const ModelConfig> config_with_shapes(const ModelConfig& base, const LlamaConfig& c) {
  nlohmann::json j = nlohmann::json::parse(base.dump());
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  return std::make_shared<const ModelConfig>(ModelConfig::parse(j.dump(), "random shapes from " + base.source()));
}

bool is_block_op(const std::string& op) {
  for (int level : {2, 3}) {
    const auto& ops = llama_block_ops(level);
    if (std::find(ops.begin(), ops.end(), op) != ops.end()) return true;
  }
  return false;
}

}  // namespace

std::vector<BenchCase> block_cases_for(const std::string& op, const std::string& model, const ModelConfig& config,
                                       const CaseOptions& options) {
  KBN_CHECK(is_block_op(op), "--target: '", op, "' is not a benchmarked Llama L2/L3 op; level 2: ",
            "qkv_parallel_linear, merged_column_parallel_linear, row_parallel_linear, llama_attention, llama_mlp; "
            "level 3: llama_decoder_layer");
  const DType dt = options.dtype;
  KBN_CHECK(dt == DType::bf16 || dt == DType::f16 || dt == DType::f32, "--dtype: expected bf16, f16 or f32, got ",
            dtype_name(dt));
  for (int64_t t : options.tokens) KBN_CHECK(t > 0, "--tokens: expected positive token counts, got ", t);
  auto mc = std::make_shared<const ModelConfig>(config);
  const LlamaConfig c = LlamaConfig::from(config);
  const int64_t es = int64_t(dtype_size(dt)), H = c.hidden_size, I = c.intermediate_size;
  const int64_t Hq = c.num_attention_heads, Hk = c.num_key_value_heads, D = c.head_dim;
  const int64_t qkv_params = H * (Hq + 2 * Hk) * D, o_params = Hq * D * H, gate_up_params = H * 2 * I,
                down_params = I * H;
  const bool attention = op == "llama_attention" || op == "llama_decoder_layer";
  const std::vector<int64_t>& tokens = options.tokens.empty() ? block_token_counts() : options.tokens;
  std::vector<BenchCase> out;
  for (int64_t T : tokens) {
    const StepShape st = step_shape(T, c.max_position_embeddings);
    BenchCase b = base_case(op, model, 1, T, dt);
    b.label = st.decode ? "decode B=" + str(T) + " ctx=" + str(st.cached[0]) : "prefill T=" + str(T);
    b.model_config = mc;
    b.args.config = mc.get();
    int64_t in_features = H, params = 0, out_features = H;
    if (op == "qkv_parallel_linear") {
      params = qkv_params;
      out_features = (Hq + 2 * Hk) * D;
    } else if (op == "merged_column_parallel_linear") {
      params = gate_up_params;
      out_features = 2 * I;
    } else if (op == "row_parallel_linear") {
      params = down_params;
      in_features = I;
    } else if (op == "llama_mlp") {
      params = gate_up_params + down_params;
    } else if (op == "llama_attention") {
      params = qkv_params + o_params;
    } else {
      params = qkv_params + o_params + gate_up_params + down_params + 2 * H;
    }
    const std::vector<int64_t> positions = step_positions(st);
    const bool layer = op == "llama_decoder_layer";
    b.make_inputs = [=](Device d, uint64_t seed) {
      if (!attention) return std::vector<Tensor>{normal({T, in_features}, dt, d, seed, "x", 1.0)};
      std::vector<Tensor> in{Tensor::from_i64(positions, {T}).to(d), normal({T, H}, dt, d, seed, "hidden_states", 1.0)};
      if (layer) in.push_back(normal({T, H}, dt, d, seed, "residual", 1.0));
      return in;
    };
    if (attention) b.make_context = [=](Device d, uint64_t seed) { return make_step_context(st, Hk, D, dt, d, seed); };
    // Roofline: every weight read once, the step's activations in and out, and (attention) the cached K/V
    // read; intermediate activations between the block's kernels are not counted (an ideal fused block).
    int64_t kv_read = 0, attn_flops = 0;
    for (size_t i = 0; attention && i < st.query.size(); ++i) {
      const int64_t q = st.query[i], kv = st.cached[i] + q;
      kv_read += 2 * kv * Hk * D * es;
      // Causal: query j of a prefill attends to cached + j + 1 keys.
      const int64_t pairs = st.decode ? kv : q * st.cached[i] + q * (q + 1) / 2;
      attn_flops += 4 * Hq * D * pairs;
    }
    const int64_t act_in = (layer ? 2 : 1) * T * in_features * es, act_out = (layer ? 2 : 1) * T * out_features * es;
    b.bytes = params * es + act_in + act_out + kv_read;
    b.flops = 2 * T * params + attn_flops;
    b.input_bytes = act_in + (attention ? kv_read + T * 8 : 0);
    b.output_numel = (layer ? 2 : 1) * T * out_features;
    b.note = "bytes and FLOPs of an ideal fused block: weights, step activations and cached K/V once";
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<BenchCase> random_cases(const std::string& op, const ModelConfig& like_config, int count, uint64_t seed,
                                    bool small, DType dtype) {
  KBN_CHECK(count >= 0, "--random: expected a count >= 0, got ", count);
  const LlamaConfig like = LlamaConfig::from(like_config);
  const bool block = is_block_op(op);
  std::vector<BenchCase> out;
  std::mt19937_64 gen(hash_seed(seed, ("random-shapes/" + op).c_str()));
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  for (int i = 0; i < count; ++i) {
    LlamaConfig c = like;
    c.head_dim = pick(0, 1) ? 128 : 64;
    c.num_key_value_heads = pick(1, small ? 2 : 8);
    c.num_attention_heads = c.num_key_value_heads * pick(1, small ? 4 : 8);
    // Odd sizes on purpose: kernels that assume a multiple of their vector width must handle the tail.
    c.hidden_size = small ? pick(17, 700) : pick(257, 8191);
    c.intermediate_size = small ? pick(17, 900) : pick(257, 15000);
    c.vocab_size = small ? pick(65, 3000) : pick(1000, 70000);
    c.max_position_embeddings = std::max<int64_t>(like.max_position_embeddings, 8192);
    const int64_t tokens = small ? pick(1, 40) : pick(1, 2500);
    CaseOptions o;
    o.dtype = dtype;
    std::vector<BenchCase> made;
    if (block) {
      // Blocks: small decode batches (the cache holds 1024 tokens per sequence) or a short prefill.
      o.tokens = {pick(0, 1) ? pick(1, small ? 3 : 64) : pick(kDecodeMaxTokens + 1, small ? 300 : 2500)};
      made = block_cases_for(op, "random", *config_with_shapes(like_config, c), o);
    } else {
      o.tokens = {op == "flash_attn_decode" ? pick(1, small ? 3 : 48) : tokens};
      made = cases_for(op, "random", c, 1, o);
    }
    for (auto& b : made) {
      b.label = "random#" + std::to_string(i) + " " + b.label;
      if (small && b.op == "flash_attn_decode" && b.label.find("ctx=1024") == std::string::npos) continue;
      out.push_back(std::move(b));
    }
  }
  return out;
}

std::string format_case_list(const std::vector<BenchCase>& cases) {
  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-24s %3s  %-48s %16s %18s\n", "op", "model", "tp", "case", "bytes", "FLOPs");
  text += line;
  for (const auto& c : cases) {
    std::snprintf(line, sizeof line, "%-20s %-24s %3lld  %-48s %16lld %18lld\n", c.op.c_str(), c.model.c_str(),
                  (long long)c.tp, c.label.c_str(), (long long)c.bytes, (long long)c.flops);
    text += line;
  }
  return text;
}

}  // namespace kbn::bench
