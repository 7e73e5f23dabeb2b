// flash_attn_decode: class FlashAttnDecode (tasks/baseline/L1/flash_attn_decode.h), one query per sequence over
// the paged cache (split-K); oracle reference::paged_attention_decode (tasks/reference/attention.cpp).
#include <algorithm>

#include "L1/flash_attn_decode.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(FlashAttnDecode)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FlashAttnDecode, "L1/flash_attn_decode.h");
KBN_REQUIRE_CTOR(FlashAttnDecode, "L1/flash_attn_decode.h", int64_t, int64_t, double, int64_t, int64_t, double);
KBN_REQUIRE_METHOD(FlashAttnDecode, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                    const KVScales&),
                   "L1/flash_attn_decode.h");
KBN_REQUIRE_METHOD(FlashAttnDecode, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&,
                    const KVScales&),
                   "L1/flash_attn_decode.h");

namespace {

// Batches B x contexts; `tokens` are batch sizes. Random cases draw a small batch of ragged sequences (the first ctx
// keys long, the others 1..ctx: cases::ragged_lengths), and CPU-sized ones keep the 1024-token context only.
std::vector<BenchCase> decode_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.attention) return {};
  const AttentionShape& a = *m.attention;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), Hq = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim;
  const DType kv = o.kv_cache_dtype.value_or(dt);  // the pages' (kernels --kv-cache-dtype)
  const int64_t kv_es = int64_t(dtype_size(kv));
  const std::string kv_label = o.kv_cache_dtype ? std::string(" kv_cache=") + dtype_name(kv) : "";
  const int64_t bs = cases::kKvBlockSize;
  std::vector<int64_t> batches = o.tokens.empty() ? cases::decode_attention_batches() : o.tokens;
  if (o.random)
    for (int64_t& B : batches) B = 1 + B % (o.small ? 3 : 48);
  std::vector<int64_t> contexts = cases::decode_attention_contexts();
  if (o.small) contexts = {contexts.front()};
  std::vector<BenchCase> out;
  for (int64_t B : batches) {
    for (int64_t ctx : contexts) {
      const std::vector<int32_t> lens =
          o.random ? cases::ragged_lengths(B, ctx) : std::vector<int32_t>(size_t(B), int32_t(ctx));
      for (const cases::AttentionVariant& v : cases::attention_variants(a)) {
        const int64_t blocks_per_seq = cases::ceil_div(ctx, bs), blocks = B * blocks_per_seq;
        const bool sinks = v.sinks;
        // Keys read over the batch: each sequence's window (pages before it are never read), else its length.
        int64_t keys = 0;
        for (int32_t n : lens) keys += v.window > 0 ? std::min<int64_t>(n, v.window) : n;
        BenchCase b = cases::base("flash_attn_decode", m, B, dt);
        b.label = "B=" + cases::str(B) + " ctx=" + cases::str(ctx) + (o.random ? " ragged" : "") +
                  " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) + v.label() + kv_label;
        b.args.values = {{"num_heads", double(Hq)},
                         {"head_size", double(D)},
                         {"scale", 1.0 / std::sqrt(double(D))},
                         {"num_kv_heads", double(Hk)},
                         {"max_query_len", 1.0},
                         {"max_seq_len", double(ctx)}};
        if (v.window > 0) b.args.values["sliding_window"] = double(v.window);
        cases::set_kv_pages(b, o);
        if (a.logits_soft_cap > 0) b.args.values["logits_soft_cap"] = a.logits_soft_cap;
        b.make_inputs = [=](Device d, uint64_t seed) {
          std::vector<Tensor> in{
              cases::normal({B, Hq, D}, dt, d, seed, "q", 1.0),
              cases::normal({blocks, bs, Hk, D}, kv, d, seed, "key_cache", 1.0),
              cases::normal({blocks, bs, Hk, D}, kv, d, seed, "value_cache", 1.0),
              cases::filled_i32(lens, d),
              cases::permutation_prefix(blocks, {B, blocks_per_seq}, DType::i32, d, seed, "block_tables")};
          if (sinks) in.push_back(cases::normal({Hq}, DType::f32, d, seed, "sinks", 1.0));
          return in;
        };
        const int64_t metadata = B * 4 + B * blocks_per_seq * 4 + (sinks ? Hq * 4 : 0);
        // The K/V read dominates: every sequence's visible keys and values once; plus q read, out written.
        b.bytes = 2 * keys * Hk * D * kv_es + 2 * B * Hq * D * es + metadata;
        b.flops = 4 * Hq * D * keys;
        b.input_bytes = B * Hq * D * es + 2 * blocks * bs * Hk * D * kv_es + metadata;
        b.output_numel = B * Hq * D;
        out.push_back(std::move(b));
      }
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "flash_attn_decode",
         .class_name = "FlashAttnDecode",
         .level = 1,
         .header = "L1/flash_attn_decode.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads", "sliding_window (optional)",
                       "logits_soft_cap (optional)", "max_seq_len (optional)", "k_scale (optional)",
                       "v_scale (optional)"},
         .args = {"q", "key_cache", "value_cache", "seq_lens", "block_tables", "sinks (optional)"},
         .mutates = {},
         .make = adapter(
             "flash_attn_decode", 5, 6,
             [](const OpArgs& a) {
               return std::make_unique<FlashAttnDecode>(a.get_int("num_heads"), a.get_int("head_size"), a.get("scale"),
                                                        a.get_int("num_kv_heads"),
                                                        a.get_int_or("sliding_window", 0), a.get("logits_soft_cap", 0.0));
             },
             [](FlashAttnDecode& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_s = a.get_int_or("max_seq_len", 0);
               const int64_t s_max = max_s ? max_s : host_max(t[3]);
               const KVScales scales = kv_scales_arg(a);
               if (t.size() == 6) return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], s_max, t[5], scales)};
               return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], s_max, scales)};
             }),
         .kernels = {"flash_attn_decode", "generic_attention"},
         .cases = decode_cases});
}

}  // namespace kbn::KBN_VARIANT
