// mla_decode: class MlaDecode (tasks/baseline/L1/mla_decode.h), multi-head latent attention decode over the paged
// latent cache with the up-projections absorbed (FlashMLA's role); oracle reference::mla_decode
// (tasks/reference/attention.cpp).
#include <cmath>

#include "L1/mla_decode.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(MlaDecode)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(MlaDecode, "L1/mla_decode.h");
KBN_REQUIRE_CTOR(MlaDecode, "L1/mla_decode.h", int64_t, int64_t, int64_t, double);
KBN_REQUIRE_METHOD(MlaDecode, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t),
                   "L1/mla_decode.h");

namespace {

// Batches x contexts of a model with MLA (DeepSeek-V2-Lite: 16 heads, V3: 128); `tokens` are batch sizes. Random
// cases draw a small batch of ragged sequences (cases::ragged_lengths), and CPU-sized ones keep the shortest context.
// The queries are absorbed ones, [B, heads, kv_lora_rank + rope]; every sequence's pages are scattered over the cache.
std::vector<BenchCase> mla_decode_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mla) return {};
  const MlaShape& a = *m.mla;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = a.num_heads, L = a.kv_lora_rank, W = a.latent_size();
  const int64_t bs = cases::kKvBlockSize;
  std::vector<int64_t> batches = o.tokens.empty() ? cases::decode_attention_batches() : o.tokens;
  if (o.random)
    for (int64_t& B : batches) B = 1 + B % (o.small ? 3 : 48);
  std::vector<int64_t> contexts = cases::decode_attention_contexts();
  if (o.small) contexts = {contexts.front()};
  std::vector<BenchCase> out;
  for (int64_t B : batches) {
    for (int64_t ctx : contexts) {
      const int64_t blocks_per_seq = cases::ceil_div(ctx, bs), blocks = B * blocks_per_seq;
      const std::vector<int32_t> lens =
          o.random ? cases::ragged_lengths(B, ctx) : std::vector<int32_t>(size_t(B), int32_t(ctx));
      int64_t keys = 0;  // latent rows over the batch
      for (int32_t n : lens) keys += n;
      BenchCase b = cases::base("mla_decode", m, B, dt);
      b.label = "B=" + cases::str(B) + " ctx=" + cases::str(ctx) + (o.random ? " ragged" : "") +
                " heads=" + cases::str(H) + " latent=" + cases::str(L) + "+" + cases::str(W - L);
      b.args.values = {{"num_heads", double(H)},
                       {"kv_lora_rank", double(L)},
                       {"rope_dim", double(W - L)},
                       {"scale", a.softmax_scale},
                       {"max_seq_len", double(ctx)}};
      b.make_inputs = [=](Device d, uint64_t seed) {
        return std::vector<Tensor>{
            cases::normal({B, H, W}, dt, d, seed, "q", 1.0),
            cases::normal({blocks, bs, W}, dt, d, seed, "kv_cache", 1.0), cases::filled_i32(lens, d),
            cases::permutation_prefix(blocks, {B, blocks_per_seq}, DType::i32, d, seed, "block_tables")};
      };
      const int64_t metadata = B * 4 + B * blocks_per_seq * 4;
      // Every latent row of every sequence read once (shared by all heads); q read, out written.
      b.bytes = keys * W * es + B * H * (W + L) * es + metadata;
      b.flops = 2 * H * keys * (W + L);
      b.input_bytes = B * H * W * es + blocks * bs * W * es + metadata;
      b.output_numel = B * H * L;
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "mla_decode",
         .class_name = "MlaDecode",
         .level = 1,
         .header = "L1/mla_decode.h",
         .ctor_args = {"num_heads", "kv_lora_rank", "rope_dim", "scale", "max_seq_len (optional)"},
         .args = {"q", "kv_cache", "seq_lens", "block_tables"},
         .mutates = {},
         .make = adapter(
             "mla_decode", 4,
             [](const OpArgs& a) {
               return std::make_unique<MlaDecode>(a.get_int("num_heads"), a.get_int("kv_lora_rank"),
                                                  a.get_int("rope_dim"), a.get("scale"));
             },
             [](MlaDecode& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_s = a.get_int_or("max_seq_len", 0);
               return Tensors{op.forward(t[0], t[1], t[2], t[3], max_s ? max_s : host_max(t[2]))};
             }),
         .kernels = {"mla_decode"},
         .cases = mla_decode_cases});
}

}  // namespace kbn::KBN_VARIANT
