// flash_attn_prefill: class FlashAttnPrefill (tasks/baseline/L1/flash_attn_prefill.h), causal varlen attention
// over the paged cache; oracle reference::paged_attention_prefill (tasks/reference/attention.cpp).
#include "L1/flash_attn_prefill.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(FlashAttnPrefill)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FlashAttnPrefill, "L1/flash_attn_prefill.h");
KBN_REQUIRE_CTOR(FlashAttnPrefill, "L1/flash_attn_prefill.h", int64_t, int64_t, double, int64_t, int64_t, double);
KBN_REQUIRE_METHOD(FlashAttnPrefill, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                    int64_t, const KVScales&),
                   "L1/flash_attn_prefill.h");
KBN_REQUIRE_METHOD(FlashAttnPrefill, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                    int64_t, const Tensor&, const KVScales&),
                   "L1/flash_attn_prefill.h");

namespace {

// The attention's prefill shapes; for multi-head latent attention (DeepSeek) the decompressed prefill it runs here:
// every head its own key of qk_head_dim and value of v_head_dim (the values' width is the value cache's). Timed cases
// are one sequence of T tokens, or T / 4096 of 4096; random ones split T into up to three sequences of unequal
// lengths, each after a cached prefix (cases::ragged_prefill), as chunked prefill calls the op.
std::vector<BenchCase> prefill_cases(const ModelView& m, const CaseOptions& o) {
  AttentionShape mla_heads;
  int64_t v_dim = 0;  // the values' width when it differs from the keys' (MLA)
  if (!m.attention && m.mla) {
    v_dim = m.mla->v_head_dim;
    mla_heads.num_heads = mla_heads.num_kv_heads = m.mla->num_heads;
    mla_heads.head_dim = m.mla->qk_head_dim();
  }
  if (!m.attention && !m.mla) return {};
  const AttentionShape& a = m.attention ? *m.attention : mla_heads;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), Hq = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim;
  const int64_t Dv = v_dim > 0 ? v_dim : D;
  const DType kv = o.kv_cache_dtype.value_or(dt);  // the pages' (kernels --kv-cache-dtype)
  const int64_t kv_es = int64_t(dtype_size(kv));
  const std::string kv_label = o.kv_cache_dtype ? std::string(" kv_cache=") + dtype_name(kv) : "";
  const int64_t bs = cases::kKvBlockSize, L_max = cases::kPrefillSequence;
  const std::vector<int64_t> tokens = o.tokens.empty() ? cases::prefill_token_counts() : o.tokens;
  std::vector<BenchCase> out;
  // One case per attention variant over sequences of query lengths q[i] after cached[i] cached keys each.
  auto add = [&](const std::string& what, const std::vector<int32_t>& q, const std::vector<int32_t>& cached) {
    const int64_t seqs = int64_t(q.size());
    int64_t T = 0, max_q = 0, max_len = 0;
    for (int64_t i = 0; i < seqs; ++i) {
      T += q[size_t(i)];
      max_q = std::max<int64_t>(max_q, q[size_t(i)]);
      max_len = std::max<int64_t>(max_len, int64_t(q[size_t(i)]) + cached[size_t(i)]);
    }
    std::vector<int32_t> starts(static_cast<size_t>(seqs + 1), 0), lens(static_cast<size_t>(seqs));
    for (int64_t i = 0; i < seqs; ++i) {
      starts[size_t(i + 1)] = starts[size_t(i)] + q[size_t(i)];
      lens[size_t(i)] = q[size_t(i)] + cached[size_t(i)];
    }
    const int64_t blocks_per_seq = cases::ceil_div(max_len, bs), blocks = seqs * blocks_per_seq;
    for (const cases::AttentionVariant& v : cases::attention_variants(a)) {
      const int64_t W = v.window;
      const bool sinks = v.sinks;
      BenchCase b = cases::base("flash_attn_prefill", m, T, dt);
      b.label = what + " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) +
                (Dv != D ? " Dv=" + cases::str(Dv) : "") + v.label() + kv_label;
      // NOTE: the launch maxima are host facts of the case, passed as constructor arguments so the adapter does
      // no device-to-host read inside the timed call (and the call can be captured in a CUDA graph).
      b.args.values = {{"num_heads", double(Hq)},        {"head_size", double(D)},
                       {"scale", 1.0 / std::sqrt(double(D))}, {"num_kv_heads", double(Hk)},
                       {"max_query_len", double(max_q)}, {"max_seq_len", double(max_len)}};
      if (W > 0) b.args.values["sliding_window"] = double(W);
      cases::set_kv_pages(b, o);
      if (a.logits_soft_cap > 0) b.args.values["logits_soft_cap"] = a.logits_soft_cap;
      b.make_inputs = [=](Device d, uint64_t seed) {
        // The new keys are already in the cache (stored by store_kvcache before attention runs).
        std::vector<Tensor> in{cases::normal({T, Hq, D}, dt, d, seed, "q", 1.0),
                               cases::normal({blocks, bs, Hk, D}, kv, d, seed, "key_cache", 1.0),
                               cases::normal({blocks, bs, Hk, Dv}, kv, d, seed, "value_cache", 1.0),
                               cases::filled_i32(starts, d),
                               cases::filled_i32(lens, d),
                               cases::permutation_prefix(blocks, {seqs, blocks_per_seq}, DType::i32, d, seed,
                                                         "block_tables")};
        if (sinks) in.push_back(cases::normal({Hq}, DType::f32, d, seed, "sinks", 1.0));
        return in;
      };
      // Keys read: each sequence's from the first one its first new query sees (every later key is in some query's
      // window), and the pairs its queries see.
      int64_t keys = 0, pairs = 0;
      for (int64_t i = 0; i < seqs; ++i) {
        const int64_t c = cached[size_t(i)];
        keys += lens[size_t(i)] - (W > 0 ? std::max<int64_t>(0, c - W + 1) : 0);
        pairs += cases::attention_pairs(q[size_t(i)], c, W);
      }
      const int64_t metadata = (seqs + 1) * 4 + seqs * 4 + seqs * blocks_per_seq * 4 + (sinks ? Hq * 4 : 0);
      // q read, out written, the keys and values read once, metadata read.
      b.bytes = T * Hq * (D + Dv) * es + keys * Hk * (D + Dv) * kv_es + metadata;
      b.flops = 2 * Hq * (D + Dv) * pairs;  // QK^T and PV over the visible pairs
      b.input_bytes = T * Hq * D * es + blocks * bs * Hk * (D + Dv) * kv_es + metadata;
      b.output_numel = T * Hq * Dv;
      out.push_back(std::move(b));
    }
  };
  for (int64_t T : tokens) {
    if (o.random) {  // up to three sequences of unequal lengths, each after a cached prefix (chunked prefill)
      const cases::RaggedPrefill r = cases::ragged_prefill(T);
      std::string what = "seqs=" + cases::str(int64_t(r.query.size()));
      for (const auto* part : {&r.query, &r.cached}) {
        what += part == &r.query ? " q=" : " cached=";
        for (size_t i = 0; i < part->size(); ++i) {
          if (i > 0) what += ",";
          what += cases::str((*part)[i]);
        }
      }
      add(what, r.query, r.cached);
      continue;
    }
    std::vector<int64_t> seq_counts{1};
    if (T > L_max && T % L_max == 0) seq_counts.push_back(T / L_max);
    for (int64_t seqs : seq_counts) {
      const int32_t L = int32_t(T / seqs);
      add("seqs=" + cases::str(seqs) + "x" + cases::str(L), std::vector<int32_t>(size_t(seqs), L),
          std::vector<int32_t>(size_t(seqs), 0));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "flash_attn_prefill",
         .class_name = "FlashAttnPrefill",
         .level = 1,
         .header = "L1/flash_attn_prefill.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads", "sliding_window (optional)",
                       "logits_soft_cap (optional)", "max_query_len (optional)", "max_seq_len (optional)",
                       "k_scale (optional)", "v_scale (optional)"},
         .args = {"q", "key_cache", "value_cache", "query_start_loc", "seq_lens", "block_tables", "sinks (optional)"},
         .mutates = {},
         .make = adapter(
             "flash_attn_prefill", 6, 7,
             [](const OpArgs& a) {
               return std::make_unique<FlashAttnPrefill>(a.get_int("num_heads"), a.get_int("head_size"), a.get("scale"),
                                                         a.get_int("num_kv_heads"),
                                                         a.get_int_or("sliding_window", 0), a.get("logits_soft_cap", 0.0));
             },
             [](FlashAttnPrefill& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_q = a.get_int_or("max_query_len", 0), max_s = a.get_int_or("max_seq_len", 0);
               const int64_t q_max = max_q ? max_q : host_max_diff(t[3]), s_max = max_s ? max_s : host_max(t[4]);
               const KVScales scales = kv_scales_arg(a);
               if (t.size() == 7)
                 return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], t[5], q_max, s_max, t[6], scales)};
               return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], t[5], q_max, s_max, scales)};
             }),
         // generic_attention: the portable kernel for head sizes the tensor-core kernels do not take, shared
         // with flash_attn_decode.
         .kernels = {"flash_attn_prefill", "generic_attention"},
         .cases = prefill_cases});
}

}  // namespace kbn::KBN_VARIANT
