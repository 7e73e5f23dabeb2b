// rotary_embedding: class RotaryEmbedding (tasks/baseline/L1/rotary_embedding.h), oracle
// tasks/reference/rotary.cpp.
#include <algorithm>

#include "L1/rotary_embedding.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(RotaryEmbedding)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(RotaryEmbedding, "L1/rotary_embedding.h");
KBN_REQUIRE_CTOR(RotaryEmbedding, "L1/rotary_embedding.h", int64_t, int64_t, int64_t, double, bool, const RopeScaling&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(RotaryEmbedding, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L1/rotary_embedding.h");
// L2/attention.h's norm_rope_qkv and Attention::forward_rope hand the table to fused_qk_norm_rope / fused_rope_kvcache
// where the rope is NeoX over the whole head.
KBN_REQUIRE_METHOD(RotaryEmbedding, bool, is_neox_style, () const, "L1/rotary_embedding.h");
KBN_REQUIRE_METHOD(RotaryEmbedding, int64_t, rotary_dim, () const, "L1/rotary_embedding.h");
template <class C>
concept kbn_rotary_has_table = requires(C& c) { static_cast<Tensor&>(c.cos_sin_cache); };
static_assert(kbn_rotary_has_table<RotaryEmbedding>,
              "L1/rotary_embedding.h: class 'RotaryEmbedding' must keep its public `Tensor cos_sin_cache` as the "
              "baseline declares it (norm_rope_qkv and Attention::forward_rope pass it to the fused ops)");

namespace {

// The constructor arguments of a rope config: base and, by rope_type, the scaling's keys (each type its own keys,
// so the adapter rebuilds the RopeScaling from which ones are present).
void rope_args(OpArgs& args, double base, const RopeScaling& s) {
  args.values["base"] = base;
  if (s.rope_type == "llama3") {
    args.values["rope_factor"] = s.factor;
    args.values["rope_low_freq_factor"] = s.low_freq_factor;
    args.values["rope_high_freq_factor"] = s.high_freq_factor;
    args.values["rope_original_max_position_embeddings"] = double(s.original_max_position_embeddings);
  } else if (s.rope_type == "linear") {
    args.values["rope_linear_factor"] = s.factor;
  } else if (s.rope_type == "yarn") {
    args.values["rope_yarn_factor"] = s.factor;
    args.values["rope_original_max_position_embeddings"] = double(s.original_max_position_embeddings);
    args.values["rope_beta_fast"] = s.beta_fast;
    args.values["rope_beta_slow"] = s.beta_slow;
    args.values["rope_truncate"] = s.truncate ? 1.0 : 0.0;
    args.values["rope_attention_factor"] = s.attention_factor;
    args.values["rope_mscale"] = s.mscale;
    args.values["rope_mscale_all_dim"] = s.mscale_all_dim;
  }
}

RopeScaling scaling_of(const OpArgs& a) {
  RopeScaling s;
  if (a.get("rope_factor", 0.0) > 0) {
    s.rope_type = "llama3";
    s.factor = a.get("rope_factor");
    s.low_freq_factor = a.get("rope_low_freq_factor");
    s.high_freq_factor = a.get("rope_high_freq_factor");
    s.original_max_position_embeddings = a.get_int("rope_original_max_position_embeddings");
  } else if (a.get("rope_linear_factor", 0.0) > 0) {
    s.rope_type = "linear";
    s.factor = a.get("rope_linear_factor");
  } else if (a.get("rope_yarn_factor", 0.0) > 0) {
    s.rope_type = "yarn";
    s.factor = a.get("rope_yarn_factor");
    s.original_max_position_embeddings = a.get_int("rope_original_max_position_embeddings");
    s.beta_fast = a.get("rope_beta_fast", 32.0);
    s.beta_slow = a.get("rope_beta_slow", 1.0);
    s.truncate = a.get("rope_truncate", 1.0) != 0.0;
    s.attention_factor = a.get("rope_attention_factor", 0.0);
    s.mscale = a.get("rope_mscale", 0.0);
    s.mscale_all_dim = a.get("rope_mscale_all_dim", 0.0);
  }
  return s;
}

// One rope of the model (its global rope, or Gemma-3's local one on the sliding layers) at every token count.
// Hq query and Hk key heads of D rotated values (MLA: the heads' rope parts and the one k_pe, GPT-J pairs).
void add_rotary_cases(std::vector<BenchCase>& out, const ModelView& m, const CaseOptions& o, double base,
                      const RopeScaling& s, const std::string& tag, int64_t Hq, int64_t Hk, int64_t D, bool neox) {
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt));
  // NOTE: CPU-sized cases build a table of at most 8192 positions (the model's frequencies, positions drawn below it):
  // a 128k x 256 table costs seconds on the host per instance. YaRN's table keeps vLLM's length (RotaryEmbedding).
  const int64_t max_pos = o.small ? std::min<int64_t>(m.max_position_embeddings, 8192) : m.max_position_embeddings;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("rotary_embedding", m, T, dt);
    b.label = "T=" + cases::str(T) + " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D) +
              (s.rope_type == "linear" || s.rope_type == "yarn" ? " " + s.rope_type : "") + tag;
    b.args.values = {{"head_size", double(D)},
                     {"rotary_dim", double(D)},
                     {"max_position_embeddings", double(max_pos)},
                     {"is_neox_style", neox ? 1.0 : 0.0}};
    rope_args(b.args, base, s);
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::randint({T}, DType::i64, d, seed, "positions", 0, max_pos),
                                 cases::normal({T, Hq * D}, dt, d, seed, "query", 1.0),
                                 cases::normal({T, Hk * D}, dt, d, seed, "key", 1.0)};
    };
    // positions [T] i64 read; query and key read and written in place; one cos|sin row [D] per token.
    b.bytes = T * 8 + 2 * T * (Hq + Hk) * D * es + T * D * es;
    b.flops = 3 * T * (Hq + Hk) * D;  // per rotated pair: 4 multiplies, 2 adds
    b.input_bytes = T * 8 + T * (Hq + Hk) * D * es;
    b.output_numel = T * (Hq + Hk) * D;
    out.push_back(std::move(b));
  }
}

std::vector<BenchCase> rotary_cases(const ModelView& m, const CaseOptions& o) {
  std::vector<BenchCase> out;
  if (m.mla) {  // DeepSeek: the query heads' rope parts (copied out contiguous) and the shared k_pe, GPT-J style
    add_rotary_cases(out, m, o, m.mla->rope.theta, m.mla->rope.scaling, " mla", m.mla->num_heads, 1,
                     m.mla->qk_rope_head_dim, false);
    return out;
  }
  if (!m.attention) return {};
  const AttentionShape& a = *m.attention;
  add_rotary_cases(out, m, o, a.rope.theta, a.rope.scaling, "", a.num_heads, a.num_kv_heads, a.head_dim, true);
  // Gemma-3's sliding layers rotate with their own base and no scaling (vLLM Gemma3Attention: rope_local_base_freq).
  if (m.config && m.config->has("rope_local_base_freq"))
    add_rotary_cases(out, m, o, m.config->get_double("rope_local_base_freq"), RopeScaling{}, " local", a.num_heads,
                     a.num_kv_heads, a.head_dim, true);
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "rotary_embedding",
         .class_name = "RotaryEmbedding",
         .level = 1,
         .header = "L1/rotary_embedding.h",
         .ctor_args = {"head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style", "rope_factor",
                       "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position_embeddings",
                       "rope_linear_factor", "rope_yarn_factor", "rope_beta_fast", "rope_beta_slow", "rope_truncate",
                       "rope_attention_factor", "rope_mscale", "rope_mscale_all_dim"},
         .args = {"positions", "query", "key"},
         .mutates = {"query", "key"},
         .make = adapter(
             "rotary_embedding", 3,
             [](const OpArgs& a) {
               return std::make_unique<RotaryEmbedding>(a.get_int("head_size"), a.get_int("rotary_dim"),
                                                        a.get_int("max_position_embeddings"), a.get("base"),
                                                        a.get("is_neox_style", 1.0) != 0.0, scaling_of(a), a.opts);
             },
             [](RotaryEmbedding& op, const Tensors& t) {
               auto [q, k] = op.forward(t[0], t[1], t[2]);
               return Tensors{q, k};
             }),
         .kernels = {"rotary_embedding_kernel"},
         .cases = rotary_cases});
}

}  // namespace kbn::KBN_VARIANT
