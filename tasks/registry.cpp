// Registers every task of this variant by name, and checks at compile time that each class keeps the
// baseline's name, constructor and forward signatures, so a candidate that drifts fails the build with a
// message naming the file, the class and the expected signature.
#include "kbn/registry.h"

#include <type_traits>

#include "kbn/variant.h"
#include "L1/all_reduce.h"
#include "L1/argmax.h"
#include "L1/embedding.h"
#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "L1/linear.h"
#include "L1/rms_norm.h"
#include "L1/rotary_embedding.h"
#include "L1/silu_and_mul.h"
#include "L1/store_kvcache.h"

// Fallback declarations: if a candidate header renames a class, unqualified lookup inside
// kbn::<variant> finds these instead, and the static_asserts below say which class went missing.
namespace kbn::missing_task_class {
#define KBN_FALLBACK(Class) \
  struct Class {            \
    static constexpr bool kbn_missing_class = true; \
  };
KBN_FALLBACK(RMSNorm)
KBN_FALLBACK(SiluAndMul)
KBN_FALLBACK(RotaryEmbedding)
KBN_FALLBACK(Embedding)
KBN_FALLBACK(Linear)
KBN_FALLBACK(AllReduce)
KBN_FALLBACK(StoreKVCache)
KBN_FALLBACK(FlashAttnPrefill)
KBN_FALLBACK(FlashAttnDecode)
KBN_FALLBACK(Argmax)
#undef KBN_FALLBACK
}  // namespace kbn::missing_task_class

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;

namespace {

using TensorPair = std::pair<Tensor, Tensor>;
using Tensors = std::vector<Tensor>;

template <class C>
concept task_class_present = !requires { C::kbn_missing_class; };

#define KBN_CAT2(a, b) a##b
#define KBN_CAT(a, b) KBN_CAT2(a, b)
#define KBN_WHERE(file) "tasks/" KBN_VARIANT_NAME "/" file " (or its baseline twin)"

#define KBN_REQUIRE_CLASS(Class, File)                                                              \
  static_assert(task_class_present<Class>, KBN_WHERE(File) ": class '" #Class "' is missing; the " \
                                                           "baseline declares it and a candidate must keep the name")

// Exact signature: the member function pointer of that type must be formable.
#define KBN_REQUIRE_METHOD(Class, Ret, Name, Params, File)                                           \
  template <class C>                                                                                 \
  concept KBN_CAT(kbn_sig_, __LINE__) = requires { static_cast<Ret (C::*) Params>(&C::Name); };      \
  static_assert(KBN_CAT(kbn_sig_, __LINE__)<Class>,                                                  \
                KBN_WHERE(File) ": class '" #Class "' must declare `" #Ret " " #Name #Params        \
                                "` exactly as the baseline does")

#define KBN_REQUIRE_CTOR(Class, File, ...)                                                           \
  static_assert(std::is_constructible_v<Class __VA_OPT__(, ) __VA_ARGS__>,                                         \
                KBN_WHERE(File) ": class '" #Class "' must be constructible from (" #__VA_ARGS__ ")")

KBN_REQUIRE_CLASS(RMSNorm, "L1/rms_norm.h");
KBN_REQUIRE_CTOR(RMSNorm, "L1/rms_norm.h", int64_t, double, const ParamOptions&);
KBN_REQUIRE_METHOD(RMSNorm, Tensor, forward, (const Tensor&), "L1/rms_norm.h");
KBN_REQUIRE_METHOD(RMSNorm, TensorPair, forward, (const Tensor&, const Tensor&), "L1/rms_norm.h");

KBN_REQUIRE_CLASS(SiluAndMul, "L1/silu_and_mul.h");
KBN_REQUIRE_CTOR(SiluAndMul, "L1/silu_and_mul.h");
KBN_REQUIRE_METHOD(SiluAndMul, Tensor, forward, (const Tensor&), "L1/silu_and_mul.h");

KBN_REQUIRE_CLASS(RotaryEmbedding, "L1/rotary_embedding.h");
KBN_REQUIRE_CTOR(RotaryEmbedding, "L1/rotary_embedding.h", int64_t, int64_t, int64_t, double, bool, const RopeScaling&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(RotaryEmbedding, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L1/rotary_embedding.h");

KBN_REQUIRE_CLASS(Embedding, "L1/embedding.h");
KBN_REQUIRE_METHOD(Embedding, Tensor, forward, (const Tensor&, const Tensor&, int64_t, int64_t), "L1/embedding.h");

KBN_REQUIRE_CLASS(Linear, "L1/linear.h");
KBN_REQUIRE_METHOD(Linear, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&), "L1/linear.h");

KBN_REQUIRE_CLASS(AllReduce, "L1/all_reduce.h");
KBN_REQUIRE_METHOD(AllReduce, Tensor, forward, (const Tensor&), "L1/all_reduce.h");

KBN_REQUIRE_CLASS(StoreKVCache, "L1/store_kvcache.h");
KBN_REQUIRE_METHOD(StoreKVCache, void, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&), "L1/store_kvcache.h");

KBN_REQUIRE_CLASS(FlashAttnPrefill, "L1/flash_attn_prefill.h");
KBN_REQUIRE_CTOR(FlashAttnPrefill, "L1/flash_attn_prefill.h", int64_t, int64_t, double, int64_t);
KBN_REQUIRE_METHOD(FlashAttnPrefill, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                    int64_t),
                   "L1/flash_attn_prefill.h");

KBN_REQUIRE_CLASS(FlashAttnDecode, "L1/flash_attn_decode.h");
KBN_REQUIRE_CTOR(FlashAttnDecode, "L1/flash_attn_decode.h", int64_t, int64_t, double, int64_t);
KBN_REQUIRE_METHOD(FlashAttnDecode, Tensor, forward,
                   (const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t),
                   "L1/flash_attn_decode.h");

KBN_REQUIRE_CLASS(Argmax, "L1/argmax.h");
KBN_REQUIRE_METHOD(Argmax, Tensor, forward, (const Tensor&), "L1/argmax.h");

// ---- type-erased adapters ----

template <class Op, class Call>
class Adapter final : public AnyOp {
 public:
  Adapter(std::unique_ptr<Op> op, Call call) : op_(std::move(op)), call_(call) {}
  Module& module() override { return *op_; }
  Tensors call(const Tensors& args) override { return call_(*op_, args); }

 private:
  std::unique_ptr<Op> op_;
  Call call_;
};

// Builds an OpEntry::make from a constructor lambda and a call lambda; checks the argument count.
template <class Make, class Call>
auto adapter(std::string name, size_t nargs, Make make, Call call) {
  return [=](const OpArgs& a) -> std::unique_ptr<AnyOp> {
    auto op = make(a);
    using Op = typename decltype(op)::element_type;
    auto checked = [=](Op& o, const Tensors& args) -> Tensors {
      KBN_CHECK(args.size() == nargs, name, ": expected ", nargs, " tensor arguments, got ", args.size());
      return call(o, args);
    };
    return std::make_unique<Adapter<Op, decltype(checked)>>(std::move(op), checked);
  };
}

// Host maxima for attention launches, read from the metadata tensors (bench/test path only).
int64_t host_max(const Tensor& t) {
  int64_t m = 0;
  for (int64_t v : t.to_ints()) m = std::max(m, v);
  return m;
}
int64_t host_max_diff(const Tensor& loc) {
  auto v = loc.to_ints();
  int64_t m = 0;
  for (size_t i = 1; i < v.size(); ++i) m = std::max(m, v[i] - v[i - 1]);
  return m;
}

}  // namespace

void register_ops(Registry& r) {
  r.add({.name = "rms_norm", .class_name = "RMSNorm", .level = 1, .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"}, .args = {"x"}, .mutates = {},
         .make = adapter("rms_norm", 1,
                         [](const OpArgs& a) { return std::make_unique<RMSNorm>(a.get_int("hidden_size"), a.get("eps"), a.opts); },
                         [](RMSNorm& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "fused_add_rms_norm", .class_name = "RMSNorm", .level = 1, .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"}, .args = {"x", "residual"}, .mutates = {"x", "residual"},
         .make = adapter("fused_add_rms_norm", 2,
                         [](const OpArgs& a) { return std::make_unique<RMSNorm>(a.get_int("hidden_size"), a.get("eps"), a.opts); },
                         [](RMSNorm& op, const Tensors& t) {
                           auto [x, res] = op.forward(t[0], t[1]);
                           return Tensors{x, res};
                         })});
  r.add({.name = "silu_and_mul", .class_name = "SiluAndMul", .level = 1, .header = "L1/silu_and_mul.h",
         .ctor_args = {}, .args = {"x"}, .mutates = {},
         .make = adapter("silu_and_mul", 1, [](const OpArgs&) { return std::make_unique<SiluAndMul>(); },
                         [](SiluAndMul& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "rotary_embedding", .class_name = "RotaryEmbedding", .level = 1, .header = "L1/rotary_embedding.h",
         .ctor_args = {"head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style", "rope_factor",
                       "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position_embeddings"},
         .args = {"positions", "query", "key"}, .mutates = {"query", "key"},
         .make = adapter("rotary_embedding", 3,
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
                         })});
  r.add({.name = "embedding", .class_name = "Embedding", .level = 1, .header = "L1/embedding.h", .ctor_args = {},
         .args = {"input_ids", "weight"}, .mutates = {},
         .make = adapter("embedding", 2, [](const OpArgs&) { return std::make_unique<Embedding>(); },
                         [](Embedding& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], 0, t[1].size(0))}; })});
  r.add({.name = "linear", .class_name = "Linear", .level = 1, .header = "L1/linear.h", .ctor_args = {},
         .args = {"x", "weight", "bias"}, .mutates = {},
         .make = adapter("linear", 3, [](const OpArgs&) { return std::make_unique<Linear>(); },
                         [](Linear& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], t[2])}; })});
  r.add({.name = "all_reduce", .class_name = "AllReduce", .level = 1, .header = "L1/all_reduce.h", .ctor_args = {},
         .args = {"x"}, .mutates = {"x"},
         .make = adapter("all_reduce", 1, [](const OpArgs&) { return std::make_unique<AllReduce>(); },
                         [](AllReduce& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "store_kvcache", .class_name = "StoreKVCache", .level = 1, .header = "L1/store_kvcache.h",
         .ctor_args = {}, .args = {"key", "value", "key_cache", "value_cache", "slot_mapping"},
         .mutates = {"key_cache", "value_cache"},
         .make = adapter("store_kvcache", 5, [](const OpArgs&) { return std::make_unique<StoreKVCache>(); },
                         [](StoreKVCache& op, const Tensors& t) {
                           op.forward(t[0], t[1], t[2], t[3], t[4]);
                           return Tensors{t[2], t[3]};
                         })});
  r.add({.name = "flash_attn_prefill", .class_name = "FlashAttnPrefill", .level = 1, .header = "L1/flash_attn_prefill.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads"},
         .args = {"q", "key_cache", "value_cache", "query_start_loc", "seq_lens", "block_tables"}, .mutates = {},
         .make = adapter("flash_attn_prefill", 6,
                         [](const OpArgs& a) {
                           return std::make_unique<FlashAttnPrefill>(a.get_int("num_heads"), a.get_int("head_size"),
                                                                     a.get("scale"), a.get_int("num_kv_heads"));
                         },
                         [](FlashAttnPrefill& op, const Tensors& t) {
                           return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], t[5], host_max_diff(t[3]), host_max(t[4]))};
                         })});
  r.add({.name = "flash_attn_decode", .class_name = "FlashAttnDecode", .level = 1, .header = "L1/flash_attn_decode.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads"},
         .args = {"q", "key_cache", "value_cache", "seq_lens", "block_tables"}, .mutates = {},
         .make = adapter("flash_attn_decode", 5,
                         [](const OpArgs& a) {
                           return std::make_unique<FlashAttnDecode>(a.get_int("num_heads"), a.get_int("head_size"),
                                                                    a.get("scale"), a.get_int("num_kv_heads"));
                         },
                         [](FlashAttnDecode& op, const Tensors& t) {
                           return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], host_max(t[3]))};
                         })});
  r.add({.name = "argmax", .class_name = "Argmax", .level = 1, .header = "L1/argmax.h", .ctor_args = {},
         .args = {"logits"}, .mutates = {},
         .make = adapter("argmax", 1, [](const OpArgs&) { return std::make_unique<Argmax>(); },
                         [](Argmax& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
}

}  // namespace kbn::KBN_VARIANT
