// fused_rope_kvcache: class FusedRopeKVCache (tasks/baseline/L1/fused_rope_kvcache.h), vLLM's RoPE + KV-cache update
// fusion; oracle: reference::rotary_embedding then reference::reshape_and_cache (tasks/reference/rotary.cpp,
// kv_cache.cpp), composed in the op's CPU path.
#include <algorithm>

#include "L1/fused_rope_kvcache.h"
#include "ops/op.h"
#include "reference/reference.h"

KBN_FALLBACK_CLASS(FusedRopeKVCache)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FusedRopeKVCache, "L1/fused_rope_kvcache.h");
KBN_REQUIRE_CTOR(FusedRopeKVCache, "L1/fused_rope_kvcache.h", int64_t, int64_t, int64_t);
KBN_REQUIRE_METHOD(FusedRopeKVCache, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const KVScales&),
                   "L1/fused_rope_kvcache.h");
// L2 Attention asks it whether the kernel takes its shapes (else it runs rotary_embedding then store_kvcache).
template <class C>
concept kbn_has_kernel_supports = requires { static_cast<bool (*)(DType, int64_t)>(&C::kernel_supports); };
static_assert(kbn_has_kernel_supports<FusedRopeKVCache>,
              "L1/fused_rope_kvcache.h: class 'FusedRopeKVCache' must declare `static bool kernel_supports(DType, "
              "int64_t)` exactly as the baseline does");

namespace {

// The attention blocks whose q and k take the rope alone (no per-head q/k norm: those run fused_qk_norm_rope), at
// every token count: qkv rows as the fused projection writes them, the rope's cos/sin table (positions drawn below a
// table of at most 8192 rows: the model's frequencies, a table the host builds quickly), pages for the tokens, and a
// slot mapping that scatters them.
std::vector<BenchCase> rope_kvcache_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (!m.attention || m.has_feature("qk_norm") || m.has_feature("gemma_norm")) return out;
  const AttentionShape& a = *m.attention;
  const DType dt = o.dtype;
  if (!FusedRopeKVCache::kernel_supports(dt, a.head_dim)) return out;
  const DType kv = o.kv_cache_dtype.value_or(dt);
  const int64_t es = int64_t(dtype_size(dt)), kv_es = int64_t(dtype_size(kv));
  const int64_t D = a.head_dim, Hq = a.num_heads, Hk = a.num_kv_heads, bs = cases::kKvBlockSize;
  const int64_t width = (Hq + 2 * Hk) * D, max_pos = std::min<int64_t>(m.max_position_embeddings, 8192);
  // The table is built once (its trig on the host costs ~10 ms; the timing modes build many input instances).
  const Tensor table = reference::rope_cos_sin_cache(D, max_pos, a.rope.theta, a.rope.scaling).to(dt);
  for (int64_t T : cases::token_counts(o)) {
    const int64_t blocks = cases::ceil_div(T, bs);
    BenchCase b = cases::base("fused_rope_kvcache", m, T, dt);
    b.label = "T=" + cases::str(T) + " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) +
              (o.kv_cache_dtype ? std::string(" kv_cache=") + dtype_name(kv) : "");
    b.args.values = {{"num_heads", double(Hq)}, {"num_kv_heads", double(Hk)}, {"head_dim", double(D)}};
    cases::set_kv_pages(b, o);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({T, width}, dt, d, seed, "qkv", 1.0),
                                 cases::randint({T}, DType::i64, d, seed, "positions", 0, max_pos),
                                 table.clone().to(d),
                                 cases::normal({blocks, bs, Hk, D}, kv, d, seed, "key_cache", 1.0),
                                 cases::normal({blocks, bs, Hk, D}, kv, d, seed, "value_cache", 1.0),
                                 cases::permutation_prefix(blocks * bs, {T}, DType::i64, d, seed, "slot_mapping")};
    };
    // The qkv rows read; q written; k and v written to the pages; one cos|sin row, position and slot per token.
    b.bytes = T * width * es + T * Hq * D * es + 2 * T * Hk * D * kv_es + T * D * es + 2 * T * 8;
    b.flops = 3 * T * (Hq + Hk) * D;  // rotation: 2 multiplies, 1 add per feature
    b.input_bytes = T * width * es + 2 * blocks * bs * Hk * D * kv_es + 2 * T * 8 + max_pos * D * es;
    b.output_numel = T * Hq * D + 2 * blocks * bs * Hk * D;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "fused_rope_kvcache",
         .class_name = "FusedRopeKVCache",
         .level = 1,
         .header = "L1/fused_rope_kvcache.h",
         .ctor_args = {"num_heads", "num_kv_heads", "head_dim", "k_scale (optional)", "v_scale (optional)"},
         .args = {"qkv", "positions", "cos_sin_cache", "key_cache", "value_cache", "slot_mapping"},
         .mutates = {"key_cache", "value_cache"},
         .make = adapter(
             "fused_rope_kvcache", 6,
             [](const OpArgs& a) {
               return std::make_unique<FusedRopeKVCache>(a.get_int("num_heads"), a.get_int("num_kv_heads"),
                                                         a.get_int("head_dim"));
             },
             [](FusedRopeKVCache& op, const Tensors& t, const OpArgs& a) {
               Tensor q = op.forward(t[0], t[1], t[2], t[3], t[4], t[5], kv_scales_arg(a));
               return Tensors{q, t[3], t[4]};
             }),
         .kernels = {"fused_rope_kvcache_kernel"},
         .cases = rope_kvcache_cases});
}

}  // namespace kbn::KBN_VARIANT
