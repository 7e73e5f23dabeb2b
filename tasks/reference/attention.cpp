// Oracle: causal attention over a paged KV cache (vLLM FlashAttention backend semantics: varlen prefill with
// chunked context, and decode), and multi-head latent attention over a paged latent cache (DeepSeek's MLA).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kbn/checks.h"
#include "kbn/parallel.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

// Row ranges of the query: sequence b owns query rows [query_start[b], query_start[b + 1]).
struct PagedBatch {
  std::vector<int64_t> query_start;  // [num_seqs + 1]
  std::vector<int64_t> seq_lens;     // [num_seqs]
  std::vector<int64_t> block_table;  // [num_seqs, max_blocks_per_seq], row-major
  int64_t max_blocks_per_seq = 0;
};

// Checks q, out and the caches; returns num_heads / num_kv_heads (query heads per kv head).
int64_t check_heads(const char* op, const Tensor& out, const Tensor& q, const Tensor& key_cache,
                    const Tensor& value_cache, const char* q_layout) {
  check_rank(q, op, "q", 3, q_layout);
  check_dtype(q, op, "q", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(q, op, "q");
  check_rank(key_cache, op, "key_cache", 4, "[num_blocks, block_size, num_kv_heads, head_size]");
  check_dtype(key_cache, op, "key_cache", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(key_cache, op, "key_cache");
  check_rank(value_cache, op, "value_cache", 4, "[num_blocks, block_size, num_kv_heads, head_size_v]");
  check_dtype(value_cache, op, "value_cache", {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(value_cache, op, "value_cache");
  // Values may be narrower or wider than keys (DeepSeek's MLA prefill: keys 192, values 128); the rest must agree.
  for (int64_t d = 0; d < 3; ++d)
    KBN_CHECK(value_cache.size(d) == key_cache.size(d), op, ": argument 'value_cache' ", value_cache.str(),
              " must match 'key_cache' ", key_cache.str(), " in every dimension but the last (head_size_v)");
  check_size(key_cache, op, "key_cache", 3, q.size(2), "head_size = q.size(2)");
  const int64_t num_heads = q.size(1), num_kv_heads = key_cache.size(2);
  KBN_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, op, ": argument 'key_cache' has ", num_kv_heads,
            " kv heads, which must divide the ", num_heads, " query heads of 'q' ", q.str(), "; got ", key_cache.str());
  check_rank(out, op, "out", 3, q_layout);
  check_dtype(out, op, "out", {DType::f32, DType::f16, DType::bf16});
  check_cpu(out, op, "out");
  KBN_CHECK(out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == value_cache.size(3), op,
            ": argument 'out' ", out.str(), " must be [", q.size(0), ", ", q.size(1),
            ", head_size_v = ", value_cache.size(3), "] (q ", q.str(), ", value_cache ", value_cache.str(), ")");
  return num_heads / num_kv_heads;
}

// Reads seq_lens and block_tables for num_seqs sequences and checks that every block a sequence uses exists.
PagedBatch read_batch(const char* op, const Tensor& seq_lens, const Tensor& block_tables, int64_t num_seqs,
                      const Tensor& key_cache) {
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_dtype(seq_lens, op, "seq_lens", {DType::i32, DType::i64});
  check_cpu(seq_lens, op, "seq_lens");
  check_size(seq_lens, op, "seq_lens", 0, num_seqs, "num_seqs");
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  check_dtype(block_tables, op, "block_tables", {DType::i32, DType::i64});
  check_cpu(block_tables, op, "block_tables");
  check_size(block_tables, op, "block_tables", 0, num_seqs, "num_seqs");

  PagedBatch batch;
  batch.seq_lens = seq_lens.to_ints();
  batch.block_table = block_tables.to_ints();
  batch.max_blocks_per_seq = block_tables.size(1);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1);
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t seq_len = batch.seq_lens[size_t(b)];
    KBN_CHECK(seq_len >= 0, op, ": argument 'seq_lens': sequence ", b, " has negative length ", seq_len);
    const int64_t blocks_used = (seq_len + block_size - 1) / block_size;
    KBN_CHECK(blocks_used <= batch.max_blocks_per_seq, op, ": argument 'block_tables' ", block_tables.str(), " has ",
              batch.max_blocks_per_seq, " blocks per sequence, but sequence ", b, " (seq_len ", seq_len,
              ", block_size ", block_size, ") needs ", blocks_used);
    for (int64_t j = 0; j < blocks_used; ++j) {
      const int64_t id = batch.block_table[size_t(b * batch.max_blocks_per_seq + j)];
      KBN_CHECK(id >= 0 && id < num_blocks, op, ": argument 'block_tables': entry [", b, ", ", j, "] = ", id,
                " is outside [0, num_blocks = ", num_blocks, ")");
    }
  }
  return batch;
}

// The first seq_len rows of a sequence's keys (or values), in logical order: position p lives in physical block
// block_table[p / block_size] at row p % block_size. cache: [num_blocks, block_size, num_kv_heads, head_size]
// -> [seq_len, num_kv_heads, head_size] as doubles.
std::vector<double> gather_sequence(const Tensor& cache, const PagedBatch& batch, int64_t b) {
  const int64_t block_size = cache.size(1), row_elems = cache.size(2) * cache.size(3);
  const int64_t seq_len = batch.seq_lens[size_t(b)];
  std::vector<double> rows;
  rows.reserve(size_t(seq_len * row_elems));
  for (int64_t first = 0; first < seq_len; first += block_size) {
    const int64_t id = batch.block_table[size_t(b * batch.max_blocks_per_seq + first / block_size)];
    const std::vector<double> block = cache.select(0, id).to_doubles();
    const int64_t rows_here = std::min(block_size, seq_len - first);
    rows.insert(rows.end(), block.begin(), block.begin() + rows_here * row_elems);
  }
  return rows;
}

// Checks the features against q's heads; returns the sinks as doubles (empty without).
std::vector<double> check_features(const char* op, const AttentionFeatures& f, const Tensor& q, const Tensor& key_cache,
                                   const Tensor& value_cache) {
  check_kv_scales(op, {f.kv_scales.k, 1.f}, key_cache.dtype());
  check_kv_scales(op, {1.f, f.kv_scales.v}, value_cache.dtype());
  KBN_CHECK(f.sliding_window >= 0, op, ": argument 'sliding_window' must be >= 0 (0: no window), got ",
            f.sliding_window);
  KBN_CHECK(std::isfinite(f.logits_soft_cap) && f.logits_soft_cap >= 0, op,
            ": argument 'logits_soft_cap' must be finite and >= 0 (0: none), got ", f.logits_soft_cap);
  if (!f.sinks) return {};
  const Tensor& sinks = *f.sinks;
  check_attention_sinks(op, sinks, q.size(1));
  check_cpu(sinks, op, "sinks");
  std::vector<double> v = sinks.to_doubles();
  for (size_t h = 0; h < v.size(); ++h) KBN_CHECK(!std::isnan(v[h]), op, ": argument 'sinks' holds NaN at head ", h);
  return v;
}

// out[row, h] = softmax_p(score(row, h, p)) V[p, kv(h)] over p in [first(row), position(row)], for every query row
// of every sequence; row j of sequence b (q_len rows) sits at position seq_len - q_len + j. score = scale * q[row, h]
// . K[p, kv(h)], then cap * tanh(score / cap) with a soft cap; first = position - window + 1 (at least 0) with a
// sliding window, else 0; a sink adds exp(sink[h]) to the softmax's denominator (not to the numerator). K and V are
// the page elements times their per-tensor scales (features.kv_scales, 1.0 but for scaled fp8 pages).
void attend(Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const PagedBatch& batch,
            int64_t heads_per_kv_head, double scale, const AttentionFeatures& features,
            const std::vector<double>& sinks) {
  const int64_t window = features.sliding_window;
  const double cap = features.logits_soft_cap;
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_size = q.size(2), head_size_v = value_cache.size(3);
  const int64_t num_kv_heads = key_cache.size(2);
  const std::vector<double> qv = q.to_doubles();
  std::vector<float> o(size_t(num_tokens * num_heads * head_size_v));
  const int64_t num_seqs = int64_t(batch.seq_lens.size());
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_begin = batch.query_start[size_t(b)], q_len = batch.query_start[size_t(b) + 1] - q_begin;
    if (q_len == 0) continue;
    const int64_t seq_len = batch.seq_lens[size_t(b)];
    // fp8 pages hold x / scale: each element reads back as e * scale.
    std::vector<double> keys = gather_sequence(key_cache, batch, b);
    std::vector<double> values = gather_sequence(value_cache, batch, b);
    for (double& k : keys) k *= double(features.kv_scales.k);
    for (double& v : values) v *= double(features.kv_scales.v);
    // Every (query row, head) is independent: threads take contiguous ranges of them (kbn/parallel.h).
    const int64_t work = seq_len * (head_size + head_size_v);
    parallel_for(q_len * num_heads, grain_for(work), [&](int64_t begin, int64_t end) {
      std::vector<double> weights(static_cast<size_t>(seq_len)), acc(static_cast<size_t>(head_size_v));
      for (int64_t i = begin; i < end; ++i) {
        const int64_t j = i / num_heads, h = i % num_heads;
        const int64_t row = q_begin + j, position = seq_len - q_len + j;
        const int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
        const int64_t kv_head = h / heads_per_kv_head;
        const double* query = &qv[size_t((row * num_heads + h) * head_size)];
        double max_score = sinks.empty() ? -std::numeric_limits<double>::infinity() : sinks[size_t(h)];
        for (int64_t p = first; p <= position; ++p) {
          const double* k = &keys[size_t((p * num_kv_heads + kv_head) * head_size)];
          double dot = 0;
          for (int64_t d = 0; d < head_size; ++d) dot += query[d] * k[d];
          double score = scale * dot;
          if (cap > 0) score = cap * std::tanh(score / cap);
          weights[size_t(p)] = score;
          max_score = std::max(max_score, score);
        }
        double denom = sinks.empty() ? 0.0 : std::exp(sinks[size_t(h)] - max_score);
        for (int64_t p = first; p <= position; ++p) {
          weights[size_t(p)] = std::exp(weights[size_t(p)] - max_score);
          denom += weights[size_t(p)];
        }
        // Every column's sum runs over p in order (the same additions as a column at a time), reading each value row
        // once and contiguously.
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t p = first; p <= position; ++p) {
          const double w = weights[size_t(p)];
          const double* v = &values[size_t((p * num_kv_heads + kv_head) * head_size_v)];
          for (int64_t d = 0; d < head_size_v; ++d) acc[size_t(d)] += w * v[d];
        }
        for (int64_t d = 0; d < head_size_v; ++d)
          o[size_t((row * num_heads + h) * head_size_v + d)] = float(acc[size_t(d)] / denom);
      }
    });
  }
  out.copy_(Tensor::from_floats(o, {num_tokens, num_heads, head_size_v}, DType::f32));
}

}  // namespace

void check_attention_sinks(const char* op, const Tensor& sinks, int64_t num_heads) {
  check_rank(sinks, op, "sinks", 1, "[num_heads]");
  check_dtype(sinks, op, "sinks", {DType::f32, DType::f16, DType::bf16});
  check_size(sinks, op, "sinks", 0, num_heads, "num_heads");
}

void paged_attention_prefill(Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                             const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables,
                             double scale, const AttentionFeatures& features) {
  constexpr const char* op = "reference::paged_attention_prefill";
  const int64_t heads_per_kv_head =
      check_heads(op, out, q, key_cache, value_cache, "[num_tokens, num_heads, head_size]");
  const std::vector<double> sinks = check_features(op, features, q, key_cache, value_cache);
  check_rank(query_start_loc, op, "query_start_loc", 1, "[num_seqs + 1]");
  check_dtype(query_start_loc, op, "query_start_loc", {DType::i32, DType::i64});
  check_cpu(query_start_loc, op, "query_start_loc");
  KBN_CHECK(query_start_loc.size(0) >= 1, op, ": argument 'query_start_loc' [num_seqs + 1] must not be empty");
  const int64_t num_seqs = query_start_loc.size(0) - 1;
  PagedBatch batch = read_batch(op, seq_lens, block_tables, num_seqs, key_cache);
  batch.query_start = query_start_loc.to_ints();
  KBN_CHECK(batch.query_start.front() == 0 && batch.query_start.back() == q.size(0), op,
            ": argument 'query_start_loc' must start at 0 and end at num_tokens = q.size(0) = ", q.size(0), ", got ",
            batch.query_start.front(), " .. ", batch.query_start.back());
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = batch.query_start[size_t(b) + 1] - batch.query_start[size_t(b)];
    KBN_CHECK(q_len >= 0, op, ": argument 'query_start_loc' must be non-decreasing, but sequence ", b,
              " has query length ", q_len);
    KBN_CHECK(q_len <= batch.seq_lens[size_t(b)], op, ": argument 'seq_lens': sequence ", b, " has seq_len ",
              batch.seq_lens[size_t(b)], " (cached + new keys), shorter than its ", q_len,
              " query tokens from 'query_start_loc'");
  }
  attend(out, q, key_cache, value_cache, batch, heads_per_kv_head, scale, features, sinks);
}

void paged_attention_decode(Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
                            const Tensor& seq_lens, const Tensor& block_tables, double scale,
                            const AttentionFeatures& features) {
  constexpr const char* op = "reference::paged_attention_decode";
  const int64_t heads_per_kv_head = check_heads(op, out, q, key_cache, value_cache, "[num_seqs, num_heads, head_size]");
  const std::vector<double> sinks = check_features(op, features, q, key_cache, value_cache);
  const int64_t num_seqs = q.size(0);
  PagedBatch batch = read_batch(op, seq_lens, block_tables, num_seqs, key_cache);
  for (int64_t b = 0; b < num_seqs; ++b) {
    KBN_CHECK(batch.seq_lens[size_t(b)] >= 1, op, ": argument 'seq_lens': sequence ", b,
              " has no keys; a decode query needs at least its own");
  }
  // One query row per sequence: the last position, which sees every cached key.
  batch.query_start.resize(size_t(num_seqs + 1));
  for (int64_t b = 0; b <= num_seqs; ++b) batch.query_start[size_t(b)] = b;
  attend(out, q, key_cache, value_cache, batch, heads_per_kv_head, scale, features, sinks);
}

namespace {

// The latent cache's checks: rank 3, a float dtype, on the CPU; returns its row width.
int64_t check_latent_cache(const char* op, const Tensor& kv_cache) {
  check_rank(kv_cache, op, "kv_cache", 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]");
  check_dtype(kv_cache, op, "kv_cache", {DType::f32, DType::f16, DType::bf16});
  check_cpu(kv_cache, op, "kv_cache");
  return kv_cache.size(2);
}

}  // namespace

void concat_and_cache_mla(Tensor& kv_cache, const Tensor& kv_c, const Tensor& k_pe, const Tensor& slot_mapping) {
  constexpr const char* op = "reference::concat_and_cache_mla";
  const int64_t width = check_latent_cache(op, kv_cache);
  check_rank(kv_c, op, "kv_c", 2, "[num_tokens, kv_lora_rank]");
  check_rank(k_pe, op, "k_pe", 2, "[num_tokens, rope_dim]");
  check_cpu(kv_c, op, "kv_c");
  check_cpu(k_pe, op, "k_pe");
  const int64_t T = kv_c.size(0), L = kv_c.size(1);
  check_size(k_pe, op, "k_pe", 0, T, "num_tokens = kv_c.size(0)");
  KBN_CHECK(L + k_pe.size(1) == width, op, ": arguments 'kv_c' ", kv_c.str(), " and 'k_pe' ", k_pe.str(),
            " make rows of ", L + k_pe.size(1), " values, but 'kv_cache' ", kv_cache.str(), " holds rows of ", width);
  check_rank(slot_mapping, op, "slot_mapping", 1, "[num_tokens]");
  check_dtype(slot_mapping, op, "slot_mapping", {DType::i32, DType::i64});
  check_cpu(slot_mapping, op, "slot_mapping");
  check_size(slot_mapping, op, "slot_mapping", 0, T, "num_tokens = kv_c.size(0)");
  const int64_t num_slots = kv_cache.size(0) * kv_cache.size(1), block_size = kv_cache.size(1);
  const std::vector<int64_t> slots = slot_mapping.to_ints();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots[size_t(t)];
    if (s == -1) continue;
    KBN_CHECK(s >= 0 && s < num_slots, op, ": argument 'slot_mapping'[", t, "] = ", s,
              " is outside [0, num_blocks * block_size = ", num_slots, ") (-1: a padding token)");
    Tensor row = kv_cache.select(0, s / block_size).select(0, s % block_size);
    row.slice(0, 0, L).copy_(kv_c.select(0, t));
    row.slice(0, L, width).copy_(k_pe.select(0, t));
  }
}

void gather_cache(Tensor& out, const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens) {
  constexpr const char* op = "reference::gather_cache";
  const int64_t width = check_latent_cache(op, kv_cache);
  check_rank(block_tables, op, "block_tables", 2, "[num_seqs, max_blocks_per_seq]");
  check_dtype(block_tables, op, "block_tables", {DType::i32});
  check_rank(seq_lens, op, "seq_lens", 1, "[num_seqs]");
  check_dtype(seq_lens, op, "seq_lens", {DType::i32});
  check_rank(out, op, "out", 3, "[num_seqs, max_seq_len, width]");
  check_cpu(out, op, "out");
  check_same_dtype(out, kv_cache, op, "out", "kv_cache");
  const int64_t S = out.size(0), Lmax = out.size(1), bs = kv_cache.size(1), nb = kv_cache.size(0);
  check_size(out, op, "out", 2, width, "the cache row width = kv_cache.size(2)");
  check_size(block_tables, op, "block_tables", 0, S, "num_seqs = out.size(0)");
  check_size(seq_lens, op, "seq_lens", 0, S, "num_seqs = out.size(0)");
  const std::vector<int64_t> lens = seq_lens.to_ints(), table = block_tables.contiguous().to_ints();
  const int64_t M = block_tables.size(1);
  out.zero_();
  for (int64_t i = 0; i < S; ++i) {
    const int64_t n = lens[size_t(i)];
    KBN_CHECK(n >= 0 && n <= Lmax && (n + bs - 1) / bs <= M, op, ": argument 'seq_lens'[", i, "] = ", n,
              " must be in [0, ", Lmax, "] (out.size(1)) and fit the ", M, " blocks of its block table");
    for (int64_t j = 0; j < n; ++j) {
      const int64_t block = table[size_t(i * M + j / bs)];
      KBN_CHECK(block >= 0 && block < nb, op, ": argument 'block_tables'[", i, ", ", j / bs, "] = ", block,
                " is outside the cache's ", nb, " blocks");
      out.select(0, i).select(0, j).copy_(kv_cache.select(0, block).select(0, j % bs));
    }
  }
}

void mla_decode(Tensor& out, const Tensor& q, const Tensor& kv_cache, const Tensor& seq_lens,
                const Tensor& block_tables, double scale) {
  constexpr const char* op = "reference::mla_decode";
  const int64_t width = check_latent_cache(op, kv_cache);
  check_rank(q, op, "q", 3, "[num_seqs, num_heads, kv_lora_rank + rope_dim]");
  check_size(q, op, "q", 2, width, "the latent row width = kv_cache.size(2)");
  check_rank(out, op, "out", 3, "[num_seqs, num_heads, kv_lora_rank]");
  check_size(out, op, "out", 0, q.size(0), "num_seqs = q.size(0)");
  check_size(out, op, "out", 1, q.size(1), "num_heads = q.size(1)");
  const int64_t L = out.size(2);
  KBN_CHECK(L > 0 && L <= width, op, ": argument 'out' ", out.str(),
            " must hold kv_lora_rank values per head, at most ", "the latent row width ", width);
  // One shared key head of the row's full width; the values are the same rows, of which the first L are kept.
  const Tensor cache = kv_cache.view({kv_cache.size(0), kv_cache.size(1), 1, width});
  Tensor full = Tensor::empty(q.shape(), DType::f32);
  paged_attention_decode(full, q, cache, cache, seq_lens, block_tables, scale);
  out.copy_(full.slice(2, 0, L));
}

void mla_attention(Tensor& out, const Tensor& q, const Tensor& kv_cache, const Tensor& kv_b_weight,
                   const Tensor& query_start_loc, const Tensor& seq_lens, const Tensor& block_tables, double scale) {
  constexpr const char* op = "reference::mla_attention";
  const int64_t width = check_latent_cache(op, kv_cache);
  check_rank(q, op, "q", 3, "[num_tokens, num_heads, qk_nope + rope_dim]");
  check_rank(kv_b_weight, op, "kv_b_weight", 2, "[num_heads * (qk_nope + v_head_dim), kv_lora_rank]");
  check_cpu(kv_b_weight, op, "kv_b_weight");
  check_rank(out, op, "out", 3, "[num_tokens, num_heads, v_head_dim]");
  const int64_t T = q.size(0), H = q.size(1), L = kv_b_weight.size(1), R = width - L, P = q.size(2) - R,
                V = out.size(2);
  KBN_CHECK(L > 0 && R > 0 && P > 0, op, ": argument 'kv_b_weight' ", kv_b_weight.str(), " (kv_lora_rank ", L,
            ") leaves ", R, " rope values of the latent row (", width, ") and ", P, " no-rope values of 'q' ", q.str(),
            "; both must be positive");
  check_size(kv_b_weight, op, "kv_b_weight", 0, H * (P + V), "num_heads * (qk_nope + v_head_dim)");
  check_size(out, op, "out", 0, T, "num_tokens = q.size(0)");
  check_size(out, op, "out", 1, H, "num_heads = q.size(1)");
  // Decompress every cached row per head, [num_blocks, block_size, H, P + R] keys and values padded to the same
  // width with zeros (vLLM pads V the same way for its non-MLA prefill), then the paged oracle.
  const int64_t nb = kv_cache.size(0), bs = kv_cache.size(1), D = P + R;
  KBN_CHECK(V <= D, op, ": v_head_dim ", V, " (argument 'out') wider than the key's ", D, " is not supported");
  const std::vector<double> lat = kv_cache.to_doubles(), w = kv_b_weight.to_doubles();
  std::vector<float> keys(size_t(nb * bs * H * D)), values(size_t(nb * bs * H * D), 0.f);
  // Cache rows are independent: threads take ranges of them.
  parallel_for(nb * bs, grain_for(H * (P + V) * L), [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const double* row = &lat[size_t(r * width)];
      for (int64_t h = 0; h < H; ++h) {
        float* k = &keys[size_t((r * H + h) * D)];
        float* v = &values[size_t((r * H + h) * D)];
        for (int64_t i = 0; i < P + V; ++i) {
          const double* wi = &w[size_t((h * (P + V) + i) * L)];
          double acc = 0;
          for (int64_t l = 0; l < L; ++l) acc += wi[l] * row[l];
          if (i < P)
            k[i] = float(acc);
          else
            v[i - P] = float(acc);
        }
        for (int64_t i = 0; i < R; ++i) k[P + i] = float(row[L + i]);
      }
    }
  });
  const Tensor key_cache = Tensor::from_floats(keys, {nb, bs, H, D});
  const Tensor value_cache = Tensor::from_floats(values, {nb, bs, H, D});
  Tensor full = Tensor::empty({T, H, D}, DType::f32);
  paged_attention_prefill(full, q, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale);
  out.copy_(full.slice(2, 0, V));
}

}  // namespace kbn::reference
