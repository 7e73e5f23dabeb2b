#include "kbn/op_case.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>

#include "kbn/error.h"
#include "kbn/rng.h"
#include "kbn/step_metadata.h"

namespace kbn::cases {

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
const std::vector<int64_t>& block_token_counts() {
  static const std::vector<int64_t> v = {1, 32, 128, 512, 4096};
  return v;
}

std::vector<int64_t> token_counts(const CaseOptions& options) {
  if (!options.tokens.empty()) return options.tokens;
  std::vector<int64_t> t = decode_token_counts();
  t.insert(t.end(), prefill_token_counts().begin(), prefill_token_counts().end());
  return t;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
std::string str(int64_t v) { return std::to_string(v); }

void set_kv_pages(BenchCase& b, const CaseOptions& options) {
  b.kv_cache_dtype = options.kv_cache_dtype;
  if (!options.kv_cache_dtype) return;
  b.args.values["k_scale"] = kFp8KScale;
  b.args.values["v_scale"] = kFp8VScale;
}

BenchCase base(const std::string& op, const ModelView& m, int64_t tokens, DType dtype) {
  BenchCase b;
  b.op = op;
  b.model = m.name;
  b.tp = m.tp;
  b.tokens = tokens;
  b.dtype = dtype;
  b.args.op = op;
  return b;
}

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

const char* routing_name(Routing routing) { return routing == Routing::uniform ? "uniform" : "skewed"; }

namespace {
double unit_double(std::mt19937_64& gen) { return double(gen() >> 11) * 0x1.0p-53; }  // [0, 1)
}  // namespace

Tensor routing_ids(int64_t tokens, int64_t top_k, int64_t num_experts, Routing routing, Device device, uint64_t seed,
                   const char* name) {
  KBN_CHECK(top_k >= 1 && top_k <= num_experts, "bench: a routing of top_k ", top_k, " over ", num_experts,
            " experts needs 1 <= top_k <= num_experts");
  std::mt19937_64 gen(hash_seed(seed, name));
  // Popularity weight of each expert: uniform, or Zipf over a seeded ranking.
  std::vector<double> popularity(static_cast<size_t>(num_experts), 1.0);
  if (routing == Routing::skewed) {
    std::vector<int64_t> rank(static_cast<size_t>(num_experts));
    std::iota(rank.begin(), rank.end(), int64_t(0));
    for (int64_t i = num_experts - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[size_t(gen() % uint64_t(i + 1))]);
    for (int64_t e = 0; e < num_experts; ++e) popularity[size_t(rank[size_t(e)])] = std::pow(double(e + 1), -1.2);
  }
  std::vector<int32_t> ids(size_t(tokens * top_k));
  std::vector<double> left(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    left = popularity;
    double total = std::accumulate(left.begin(), left.end(), 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      // One draw among the experts this token has not taken yet.
      double x = unit_double(gen) * total;
      int64_t pick = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        if (left[size_t(e)] == 0) continue;
        pick = e;
        if (x < left[size_t(e)]) break;
        x -= left[size_t(e)];
      }
      ids[size_t(t * top_k + j)] = int32_t(pick);
      total -= left[size_t(pick)];
      left[size_t(pick)] = 0;
    }
  }
  return Tensor::from_i32(ids, {tokens, top_k}).to(device);
}

Tensor routing_weights(int64_t tokens, int64_t top_k, Device device, uint64_t seed, const char* name) {
  std::mt19937_64 gen(hash_seed(seed, name));
  std::vector<float> w(size_t(tokens * top_k));
  std::vector<double> row(static_cast<size_t>(top_k));
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (double& v : row) sum += (v = 0.05 + unit_double(gen));
    std::sort(row.begin(), row.end(), std::greater<>());
    for (int64_t j = 0; j < top_k; ++j) w[size_t(t * top_k + j)] = float(row[size_t(j)] / sum);
  }
  return Tensor::from_floats(w, {tokens, top_k}, DType::f32).to(device);
}

std::string AttentionVariant::label() const {
  std::string l;
  if (window > 0) l += " window=" + str(window);
  if (sinks) l += " sinks";
  return l;
}

std::vector<AttentionVariant> attention_variants(const AttentionShape& a) {
  std::vector<AttentionVariant> v{{0, false}};
  if (a.sinks) v.push_back({0, true});
  if (a.sliding_window > 0) v.push_back({a.sliding_window, a.sinks});
  return v;
}

int64_t attention_pairs(int64_t L, int64_t cached, int64_t window) {
  int64_t pairs = 0;
  if (window <= 0) return L * cached + L * (L + 1) / 2;
  // Query j (0-based among the new tokens) sees min(cached + j + 1, window) keys.
  const int64_t ramp = std::clamp<int64_t>(window - cached, 0, L);  // queries still short of a full window
  pairs += ramp * cached + ramp * (ramp + 1) / 2;
  pairs += (L - ramp) * window;
  return pairs;
}

Tensor filled_i32(const std::vector<int32_t>& values, Device device) {
  return Tensor::from_i32(values, {int64_t(values.size())}).to(device);
}

namespace {
// A fixed pseudo-random value of (i, salt): splitmix64's finaliser.
uint64_t mix(uint64_t i, uint64_t salt) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull ^ salt * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<int32_t> ragged_lengths(int64_t B, int64_t ctx) {
  KBN_CHECK(B > 0 && ctx > 0 && ctx <= INT32_MAX, "cases::ragged_lengths: B ", B, " and ctx ", ctx,
            " must be positive (ctx < 2^31)");
  std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(ctx));
  for (int64_t i = 1; i < B; ++i) lens[size_t(i)] = int32_t(1 + mix(uint64_t(i), uint64_t(ctx)) % uint64_t(ctx));
  return lens;
}

RaggedPrefill ragged_prefill(int64_t T) {
  KBN_CHECK(T > 0 && T <= INT32_MAX / 2, "cases::ragged_prefill: T ", T, " must be in [1, 2^30)");
  const int64_t seqs = std::min<int64_t>(T, 3);
  RaggedPrefill r;
  int64_t left = T;
  for (int64_t i = 0; i < seqs; ++i) {
    // Sequence i takes 1 .. (what is left, minus one token for each sequence after it); the last takes the rest.
    const int64_t spare = left - (seqs - i);
    const int64_t q = i + 1 == seqs ? left : 1 + int64_t(mix(uint64_t(i), uint64_t(T)) % uint64_t(spare + 1));
    r.query.push_back(int32_t(q));
    r.cached.push_back(int32_t(mix(uint64_t(i) + 7, uint64_t(T)) % uint64_t(q + 1)));  // 0 .. q
    left -= q;
  }
  return r;
}

int64_t StepShape::tokens() const {
  int64_t t = 0;
  for (int64_t q : query) t += q;
  return t;
}

std::vector<int64_t> StepShape::positions() const {
  std::vector<int64_t> pos;
  for (size_t i = 0; i < query.size(); ++i)
    for (int64_t j = 0; j < query[i]; ++j) pos.push_back(cached[i] + j);
  return pos;
}

std::string StepShape::label() const {
  return decode ? "decode B=" + str(int64_t(query.size())) + " ctx=" + str(cached.at(0)) : "prefill T=" + str(tokens());
}

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

std::shared_ptr<StepContext> make_step_context(const StepShape& st, int64_t kv_heads, int64_t head_dim, DType dt,
                                               Device d, uint64_t seed) {
  const int64_t seqs = int64_t(st.query.size());
  int64_t max_len = 0;
  for (int64_t i = 0; i < seqs; ++i) max_len = std::max(max_len, st.cached[size_t(i)] + st.query[size_t(i)]);
  const int64_t bps = ceil_div(max_len, kKvBlockSize), blocks = seqs * bps;
  // Blocks scattered over the cache from a seeded permutation, as a long-running server's would be.
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 gen(hash_seed(seed, "block_tables"));
  std::shuffle(table.begin(), table.end(), gen);
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(seqs));
  std::vector<StepSequence> step;
  for (int64_t i = 0; i < seqs; ++i) {
    rows[size_t(i)].assign(table.begin() + i * bps, table.begin() + (i + 1) * bps);
    step.push_back({st.cached[size_t(i)], st.query[size_t(i)], &rows[size_t(i)], !st.decode});
  }
  auto ctx = std::make_shared<StepContext>();
  ctx->metadata = upload_step_metadata(build_step_layout(step, kKvBlockSize), d);
  // The cached tokens' K and V: random, like any earlier step's output; the step writes its own slots.
  ctx->kv_caches.push_back({normal({blocks, kKvBlockSize, kv_heads, head_dim}, dt, d, seed, "key_cache", 1.0),
                            normal({blocks, kKvBlockSize, kv_heads, head_dim}, dt, d, seed, "value_cache", 1.0)});
  return ctx;
}

std::shared_ptr<StepContext> make_state_step_context(const StepShape& st, const std::vector<Shape>& state_shapes,
                                                     DType dt, Device d, uint64_t seed) {
  const int64_t seqs = int64_t(st.query.size()), slots = seqs + 3;
  std::vector<int32_t> order(static_cast<size_t>(slots));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 gen(hash_seed(seed, "state_slots"));
  std::shuffle(order.begin(), order.end(), gen);
  int64_t max_len = 0;
  for (int64_t i = 0; i < seqs; ++i) max_len = std::max(max_len, st.cached[size_t(i)] + st.query[size_t(i)]);
  // No paged layer reads these blocks; the metadata still carries a block table per sequence.
  const std::vector<int32_t> table(static_cast<size_t>(ceil_div(max_len, kKvBlockSize)), 0);
  std::vector<StepSequence> step;
  for (int64_t i = 0; i < seqs; ++i)
    step.push_back({st.cached[size_t(i)], st.query[size_t(i)], &table, !st.decode, order[size_t(i)]});
  auto ctx = std::make_shared<StepContext>();
  ctx->metadata = upload_step_metadata(build_step_layout(step, kKvBlockSize), d);
  KVCache layer;
  for (size_t k = 0; k < state_shapes.size(); ++k) {
    Shape full{slots};
    full.insert(full.end(), state_shapes[k].begin(), state_shapes[k].end());
    const std::string name = "state" + std::to_string(k);
    layer.states.push_back(normal(full, dt, d, seed, name.c_str(), 1.0));
  }
  ctx->kv_caches.push_back(std::move(layer));
  return ctx;
}

static std::shared_ptr<StepContext> make_latent_step_context(const StepShape& st, int64_t latent_size, DType dt,
                                                             Device d, uint64_t seed) {
  // The paged K/V context's metadata and block layout, with one latent cache in place of K and V.
  std::shared_ptr<StepContext> ctx = make_step_context(st, 1, 1, dt, d, seed);
  KVCache& layer = ctx->kv_caches.front();
  const int64_t blocks = layer.key.size(0);
  layer = KVCache{};
  layer.latent = normal({blocks, kKvBlockSize, latent_size}, dt, d, seed, "latent_cache", 1.0);
  return ctx;
}

std::vector<BenchCase> block_cases(const std::string& op, const ModelView& m, const CaseOptions& options,
                                   const BlockFacts& f) {
  KBN_CHECK(m.tp == 1, "--tp: blocks (", op,
            ") run on one GPU here; tensor-parallel blocks need a process group (use --tp with level-1 ops for "
            "per-rank shapes)");
  KBN_CHECK(!f.attention || m.attention || m.mla, "block ", op, ": model '", m.name, "' has no attention");
  const DType dt = options.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = m.hidden_size;
  // Multi-head latent attention (DeepSeek): one latent row per token in a paged latent cache instead of K/V heads.
  const bool latent = f.attention && !m.attention && m.mla;
  const int64_t Hq = !f.attention ? 0 : latent ? m.mla->num_heads : m.attention->num_heads,
                Hk = f.attention && !latent ? m.attention->num_kv_heads : 0,
                D = f.attention && !latent ? m.attention->head_dim : 0, W = latent ? m.mla->latent_size() : 0,
                L = latent ? m.mla->kv_lora_rank : 0,
                qk_v = latent ? m.mla->qk_head_dim() + m.mla->v_head_dim : 0;
  const std::vector<int64_t>& tokens = options.tokens.empty() ? block_token_counts() : options.tokens;
  std::vector<BenchCase> out;
  for (int64_t T : tokens) {
    const StepShape st = step_shape(T, m.max_position_embeddings);
    BenchCase b = base(op, m, T, dt);
    b.label = st.label();
    b.model_config = m.config;
    b.args.config = m.config.get();
    const int64_t in_features = f.in_features, out_features = f.out_features;
    const std::vector<int64_t> positions = st.positions();
    const bool attention = f.attention, layer = f.residual;
    const bool stateful = !f.state_shapes.empty();
    const DType res_dt = f.residual_f32 ? DType::f32 : dt;
    b.make_inputs = [=](Device d, uint64_t seed) {
      if (stateful) {
        std::vector<Tensor> in{normal({T, H}, dt, d, seed, "hidden_states", 1.0)};
        if (layer) in.push_back(normal({T, H}, res_dt, d, seed, "residual", 1.0));
        return in;
      }
      if (!attention) return std::vector<Tensor>{normal({T, in_features}, dt, d, seed, "x", 1.0)};
      std::vector<Tensor> in{Tensor::from_i64(positions, {T}).to(d), normal({T, H}, dt, d, seed, "hidden_states", 1.0)};
      if (layer) in.push_back(normal({T, H}, dt, d, seed, "residual", 1.0));
      return in;
    };
    if (attention && !latent)
      b.make_context = [=](Device d, uint64_t seed) { return make_step_context(st, Hk, D, dt, d, seed); };
    if (latent) b.make_context = [=](Device d, uint64_t seed) { return make_latent_step_context(st, W, dt, d, seed); };
    const std::vector<Shape> state_shapes = f.state_shapes;
    int64_t state_rw = 0;  // each sequence's state written, and read when it has one (decode)
    for (const Shape& sh : state_shapes)
      state_rw += shape_numel(sh) * es * (st.decode ? 2 : 1) * int64_t(st.query.size());
    if (stateful)
      b.make_context = [=](Device d, uint64_t seed) { return make_state_step_context(st, state_shapes, dt, d, seed); };
    // Roofline: every weight read once, the step's activations in and out, and (attention) the cached K/V
    // read; intermediate activations between the block's kernels are not counted (an ideal fused block).
    int64_t kv_read = 0, attn_flops = 0;
    for (size_t i = 0; attention && i < st.query.size(); ++i) {
      const int64_t q = st.query[i], kv = st.cached[i] + q;
      // Causal: query j of a prefill attends to cached + j + 1 keys.
      const int64_t pairs = st.decode ? kv : q * st.cached[i] + q * (q + 1) / 2;
      if (latent) {
        // Decode: absorbed, scores over the W-wide latent and values of its first L; prefill: decompressed heads.
        kv_read += kv * W * es;
        attn_flops += st.decode ? 2 * Hq * pairs * (W + L) : 2 * Hq * pairs * qk_v;
      } else {
        kv_read += 2 * kv * Hk * D * es;
        attn_flops += 4 * Hq * D * pairs;
      }
    }
    const int64_t res_es = int64_t(dtype_size(res_dt));
    const int64_t act_in = T * in_features * es + (layer ? T * in_features * res_es : 0),
                  act_out = T * out_features * es + (layer ? T * out_features * res_es : 0);
    b.bytes = f.params * es + act_in + act_out + kv_read + state_rw;
    b.flops = 2 * T * f.params + attn_flops;
    b.input_bytes = act_in + (attention ? kv_read + T * 8 : 0) + state_rw;
    b.output_numel = (layer ? 2 : 1) * T * out_features;
    b.note = stateful ? "bytes of an ideal fused block: weights, step activations and the sequences' states once; "
                        "FLOPs: the projections only (the scan's are the L1 op's); the timed call also restores the "
                        "states from a snapshot (one copy of them)"
                      : "bytes and FLOPs of an ideal fused block: weights, step activations and cached K/V once";
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace kbn::cases
