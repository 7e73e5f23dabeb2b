// store_kvcache: class StoreKVCache (tasks/baseline/L1/store_kvcache.h), vLLM's reshape_and_cache_flash; oracle
// reference::reshape_and_cache (tasks/reference/kv_cache.cpp).
#include "L1/store_kvcache.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(StoreKVCache)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(StoreKVCache, "L1/store_kvcache.h");
KBN_REQUIRE_METHOD(StoreKVCache, void, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const KVScales&),
                   "L1/store_kvcache.h");

namespace {

std::vector<BenchCase> store_kvcache_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.attention) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), Hk = m.attention->num_kv_heads, D = m.attention->head_dim;
  const int64_t bs = cases::kKvBlockSize;
  // kernels --kv-cache-dtype fp8: fp8 e4m3 pages written with calibrated per-tensor scales.
  const DType kv = o.kv_cache_dtype.value_or(dt);
  const int64_t kv_es = int64_t(dtype_size(kv));
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    const int64_t blocks = cases::ceil_div(T, bs);
    BenchCase b = cases::base("store_kvcache", m, T, dt);
    b.label = "T=" + cases::str(T) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) + " blocks=" + cases::str(blocks) +
              (o.kv_cache_dtype ? std::string(" kv_cache=") + dtype_name(kv) : "");
    cases::set_kv_pages(b, o);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{
          cases::normal({T, Hk, D}, dt, d, seed, "key", 1.0), cases::normal({T, Hk, D}, dt, d, seed, "value", 1.0),
          cases::normal({blocks, bs, Hk, D}, kv, d, seed, "key_cache", 1.0),
          cases::normal({blocks, bs, Hk, D}, kv, d, seed, "value_cache", 1.0),
          cases::permutation_prefix(blocks * bs, {T}, DType::i64, d, seed, "slot_mapping")};
    };
    // key, value [T, kv, D] and slot_mapping [T] i64 read; T rows written into each cache (the rest untouched).
    b.bytes = 2 * T * Hk * D * (es + kv_es) + T * 8;
    b.flops = 0;
    b.input_bytes = 2 * T * Hk * D * es + 2 * blocks * bs * Hk * D * kv_es + T * 8;
    b.output_numel = 2 * blocks * bs * Hk * D;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "store_kvcache",
         .class_name = "StoreKVCache",
         .level = 1,
         .header = "L1/store_kvcache.h",
         .ctor_args = {"k_scale (optional)", "v_scale (optional)"},
         .args = {"key", "value", "key_cache", "value_cache", "slot_mapping"},
         .mutates = {"key_cache", "value_cache"},
         .make = adapter(
             "store_kvcache", 5, [](const OpArgs&) { return std::make_unique<StoreKVCache>(); },
             [](StoreKVCache& op, const Tensors& t, const OpArgs& a) {
               op.forward(t[0], t[1], t[2], t[3], t[4], kv_scales_arg(a));
               return Tensors{t[2], t[3]};
             }),
         .kernels = {"store_kvcache"},
         .cases = store_kvcache_cases,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
