// rotary_embedding: class RotaryEmbedding (tasks/baseline/L1/rotary_embedding.h), oracle
// tasks/reference/rotary.cpp.
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

namespace {

std::vector<BenchCase> rotary_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.attention) return {};
  const AttentionShape& a = *m.attention;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), D = a.head_dim, Hq = a.num_heads, Hk = a.num_kv_heads;
  const int64_t max_pos = m.max_position_embeddings;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    BenchCase b = cases::base("rotary_embedding", m, T, dt);
    b.label = "T=" + cases::str(T) + " heads=" + cases::str(Hq) + " kv=" + cases::str(Hk) + " D=" + cases::str(D);
    b.args.values = {{"head_size", double(D)},
                     {"rotary_dim", double(D)},
                     {"max_position_embeddings", double(max_pos)},
                     {"base", a.rope.theta},
                     {"is_neox_style", 1.0}};
    const RopeScaling& s = a.rope.scaling;
    if (s.rope_type == "llama3") {
      b.args.values["rope_factor"] = s.factor;
      b.args.values["rope_low_freq_factor"] = s.low_freq_factor;
      b.args.values["rope_high_freq_factor"] = s.high_freq_factor;
      b.args.values["rope_original_max_position_embeddings"] = double(s.original_max_position_embeddings);
    }
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
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "rotary_embedding",
         .class_name = "RotaryEmbedding",
         .level = 1,
         .header = "L1/rotary_embedding.h",
         .ctor_args = {"head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style", "rope_factor",
                       "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position_embeddings"},
         .args = {"positions", "query", "key"},
         .mutates = {"query", "key"},
         .make = adapter(
             "rotary_embedding", 3,
             [](const OpArgs& a) {
               RopeScaling s;
               if (a.get("rope_factor", 0.0) > 0) {
                 s.rope_type = "llama3";
                 s.factor = a.get("rope_factor");
                 s.low_freq_factor = a.get("rope_low_freq_factor");
                 s.high_freq_factor = a.get("rope_high_freq_factor");
                 s.original_max_position_embeddings = a.get_int("rope_original_max_position_embeddings");
               }
               return std::make_unique<RotaryEmbedding>(a.get_int("head_size"), a.get_int("rotary_dim"),
                                                        a.get_int("max_position_embeddings"), a.get("base"),
                                                        a.get("is_neox_style", 1.0) != 0.0, s, a.opts);
             },
             [](RotaryEmbedding& op, const Tensors& t) {
               auto [q, k] = op.forward(t[0], t[1], t[2]);
               return Tensors{q, k};
             }),
         .kernels = {"rotary_embedding_kernel"},
         .cases = rotary_cases});
}

}  // namespace kbn::KBN_VARIANT
