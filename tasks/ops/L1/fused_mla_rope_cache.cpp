// fused_mla_rope_cache: class FusedMlaRopeCache (tasks/baseline/L1/fused_mla_rope_cache.h), DeepSeek's MLA norm +
// rope + latent store + absorbed-query tail in one kernel; oracle: reference::rms_norm, rotary_embedding (GPT-J pairs)
// and concat_and_cache_mla (tasks/reference/), composed in the op's CPU path.
#include <algorithm>

#include "L1/fused_mla_rope_cache.h"
#include "ops/op.h"
#include "reference/reference.h"

KBN_FALLBACK_CLASS(FusedMlaRopeCache)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(FusedMlaRopeCache, "L1/fused_mla_rope_cache.h");
KBN_REQUIRE_CTOR(FusedMlaRopeCache, "L1/fused_mla_rope_cache.h", int64_t, int64_t, int64_t, int64_t, double);
KBN_REQUIRE_METHOD(FusedMlaRopeCache, void, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&),
                   "L1/fused_mla_rope_cache.h");
// Its callers ask it whether the kernel takes their widths (else they run the four ops).
template <class C>
concept kbn_mla_has_kernel_supports =
    requires { static_cast<bool (*)(DType, int64_t, int64_t)>(&C::kernel_supports); };
static_assert(kbn_mla_has_kernel_supports<FusedMlaRopeCache>,
              "L1/fused_mla_rope_cache.h: class 'FusedMlaRopeCache' must declare `static bool kernel_supports(DType, "
              "int64_t, int64_t)` exactly as the baseline does");

namespace {

// FlashMLA reads pages of 64 rows (as concat_and_cache_mla's cases).
constexpr int64_t kLatentBlockSize = 64;

// A step of T tokens whose last half (at least one) decode: kv_a as kv_a_proj_with_mqa writes it, q as q_proj writes
// it viewed [T, heads, nope + rope], the model's rope table (at most 8192 positions: the host builds it once), the
// norm's weight, pages with a block to spare, every seventh token a padding token (slot -1), and q_abs for the decode
// tokens (its latent part left as drawn: the op writes only the rope tail).
std::vector<BenchCase> mla_rope_cache_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mla) return {};
  const MlaShape& a = *m.mla;
  const DType dt = o.dtype;
  const int64_t L = a.kv_lora_rank, R = a.qk_rope_head_dim, P = a.qk_nope_head_dim, H = a.num_heads;
  if (!FusedMlaRopeCache::kernel_supports(dt, L, R)) return {};
  const int64_t es = int64_t(dtype_size(dt)), W = L + R, D = P + R, bs = kLatentBlockSize;
  const int64_t max_pos = std::min<int64_t>(m.max_position_embeddings, 8192);
  const Tensor table = reference::rope_cos_sin_cache(R, max_pos, a.rope.theta, a.rope.scaling).to(dt);
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    const int64_t blocks = cases::ceil_div(T, bs) + 1, padding = T / 7, nd = (T + 1) / 2;
    BenchCase b = cases::base("fused_mla_rope_cache", m, T, dt);
    b.label = "T=" + cases::str(T) + " decode=" + cases::str(nd) + " heads=" + cases::str(H) + " latent=" +
              cases::str(L) + "+" + cases::str(R);
    b.args.values = {{"num_heads", double(H)},
                     {"qk_nope_head_dim", double(P)},
                     {"qk_rope_head_dim", double(R)},
                     {"kv_lora_rank", double(L)},
                     {"eps", m.rms_norm_eps}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      std::vector<int64_t> slots =
          cases::permutation_prefix(blocks * bs, {T}, DType::i64, Device::cpu(), seed, "slot_mapping").to_ints();
      for (int64_t t = 6; t < T; t += 7) slots[size_t(t)] = -1;
      return std::vector<Tensor>{cases::normal({T, W}, dt, d, seed, "kv_a", 1.0),
                                 cases::normal({T, H, D}, dt, d, seed, "q", 1.0),
                                 cases::randint({T}, DType::i64, d, seed, "positions", 0, max_pos),
                                 table.clone().to(d),
                                 cases::normal({L}, dt, d, seed, "norm_weight", 1.0),
                                 cases::normal({blocks, bs, W}, dt, d, seed, "kv_cache", 1.0),
                                 Tensor::from_i64(slots, {T}).to(d),
                                 cases::normal({nd, H, W}, dt, d, seed, "q_abs", 1.0)};
    };
    // kv_a read; q's rope parts read and written; the stored rows written; the decode tokens' rope tails written; the
    // weight, one cos|sin row, a position and a slot per token.
    b.bytes = T * W * es + 2 * T * H * R * es + (T - padding) * W * es + nd * H * R * es + L * es + T * R * es +
              2 * T * 8;
    b.flops = 3 * T * L + 3 * T * (H + 1) * R;  // the norm (square, add, scale) and the rotation
    b.input_bytes = T * W * es + T * H * D * es + 2 * T * 8 + max_pos * R * es + L * es + blocks * bs * W * es +
                    nd * H * W * es;
    b.output_numel = T * H * D + blocks * bs * W + nd * H * W;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "fused_mla_rope_cache",
         .class_name = "FusedMlaRopeCache",
         .level = 1,
         .header = "L1/fused_mla_rope_cache.h",
         .ctor_args = {"num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank", "eps"},
         .args = {"kv_a", "q", "positions", "cos_sin_cache", "norm_weight", "kv_cache", "slot_mapping", "q_abs"},
         .mutates = {"q", "kv_cache", "q_abs"},
         .make = adapter(
             "fused_mla_rope_cache", 8,
             [](const OpArgs& a) {
               return std::make_unique<FusedMlaRopeCache>(a.get_int("num_heads"), a.get_int("qk_nope_head_dim"),
                                                          a.get_int("qk_rope_head_dim"), a.get_int("kv_lora_rank"),
                                                          a.get("eps"));
             },
             [](FusedMlaRopeCache& op, const Tensors& t) {
               op.forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
               return Tensors{t[1], t[5], t[7]};
             }),
         .kernels = {"fused_mla_rope_cache_kernel"},
         .cases = mla_rope_cache_cases});
}

}  // namespace kbn::KBN_VARIANT
