// concat_and_cache_mla: class ConcatAndCacheMLA (tasks/baseline/L1/concat_and_cache_mla.h), vLLM's concat_and_cache_mla
// (the paged latent cache store of MLA); oracle reference::concat_and_cache_mla (tasks/reference/attention.cpp).
#include "L1/concat_and_cache_mla.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(ConcatAndCacheMLA)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(ConcatAndCacheMLA, "L1/concat_and_cache_mla.h");
KBN_REQUIRE_METHOD(ConcatAndCacheMLA, void, forward, (const Tensor&, const Tensor&, const Tensor&, const Tensor&),
                   "L1/concat_and_cache_mla.h");

namespace {

// FlashMLA reads pages of 64 rows.
constexpr int64_t kLatentBlockSize = 64;

// The token counts of a step; kv_c is its own tensor (kv_a_layernorm's output) and k_pe a view into
// kv_a_proj_with_mqa's output [T, kv_lora_rank + rope_dim] after the rotary embedding, as in DeepSeek-V2's MLA.
// Every seventh token is a padding token (slot -1), the others land on distinct slots scattered over a cache with
// a block to spare.
std::vector<BenchCase> concat_and_cache_mla_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mla) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), L = m.mla->kv_lora_rank, R = m.mla->qk_rope_head_dim, W = L + R;
  const int64_t bs = kLatentBlockSize;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    const int64_t blocks = cases::ceil_div(T, bs) + 1, padding = T / 7;
    BenchCase b = cases::base("concat_and_cache_mla", m, T, dt);
    b.label = "T=" + cases::str(T) + " latent=" + cases::str(L) + "+" + cases::str(R) + " blocks=" +
              cases::str(blocks) + "x" + cases::str(bs);
    b.make_inputs = [=](Device d, uint64_t seed) {
      const Tensor kv_a = cases::normal({T, W}, dt, d, seed, "kv_a", 1.0);
      std::vector<int64_t> slots =
          cases::permutation_prefix(blocks * bs, {T}, DType::i64, Device::cpu(), seed, "slot_mapping").to_ints();
      for (int64_t t = 6; t < T; t += 7) slots[size_t(t)] = -1;
      return std::vector<Tensor>{cases::normal({T, L}, dt, d, seed, "kv_c", 1.0),
                                 kv_a.as_strided({T, R}, {W, 1}, kv_a.offset() + L),
                                 cases::normal({blocks, bs, W}, dt, d, seed, "kv_cache", 1.0),
                                 Tensor::from_i64(slots, {T}).to(d)};
    };
    // kv_c and k_pe read and their rows written for the tokens with a slot; slot_mapping read.
    b.bytes = 2 * (T - padding) * W * es + T * 8;
    b.flops = 0;
    b.input_bytes = T * L * es + T * W * es + blocks * bs * W * es + T * 8;
    b.output_numel = blocks * bs * W;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "concat_and_cache_mla",
         .class_name = "ConcatAndCacheMLA",
         .level = 1,
         .header = "L1/concat_and_cache_mla.h",
         .ctor_args = {},
         .args = {"kv_c", "k_pe", "kv_cache", "slot_mapping"},
         .mutates = {"kv_cache"},
         .make = adapter(
             "concat_and_cache_mla", 4, [](const OpArgs&) { return std::make_unique<ConcatAndCacheMLA>(); },
             [](ConcatAndCacheMLA& op, const Tensors& t) {
               op.forward(t[0], t[1], t[2], t[3]);
               return Tensors{t[2]};
             }),
         .kernels = {"concat_and_cache_mla"},
         .cases = concat_and_cache_mla_cases,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
