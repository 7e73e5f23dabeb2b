// Registers every task of this variant by name, and checks at compile time that each class keeps the
// baseline's name, constructor and forward signatures, so a candidate that drifts fails the build with a
// message naming the file, the class and the expected signature.
#include "kbn/registry.h"

#include <cmath>
#include <type_traits>

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
#include "L2/attention.h"
#include "L2/llama_attention.h"
#include "L2/llama_mlp.h"
#include "L2/parallel_linear.h"
#include "L2/vocab_parallel_embedding.h"
#include "L3/llama_decoder_layer.h"
#include "L4/llama.h"
#include "kbn/variant.h"

// Fallback declarations: if a candidate header renames a class, unqualified lookup inside
// kbn::<variant> finds these instead, and the static_asserts below say which class went missing.
namespace kbn::missing_task_class {
#define KBN_FALLBACK(Class)                         \
  struct Class {                                    \
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
KBN_FALLBACK(ColumnParallelLinear)
KBN_FALLBACK(MergedColumnParallelLinear)
KBN_FALLBACK(QKVParallelLinear)
KBN_FALLBACK(RowParallelLinear)
KBN_FALLBACK(VocabParallelEmbedding)
KBN_FALLBACK(ParallelLMHead)
KBN_FALLBACK(Attention)
KBN_FALLBACK(LlamaAttention)
KBN_FALLBACK(LlamaMLP)
KBN_FALLBACK(LlamaDecoderLayer)
KBN_FALLBACK(LlamaModel)
KBN_FALLBACK(LlamaForCausalLM)
#undef KBN_FALLBACK
}  // namespace kbn::missing_task_class

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;

namespace {

using TensorPair = std::pair<Tensor, Tensor>;
using Tensors = std::vector<Tensor>;

template <class C>
concept task_class_present = !requires {
  C::kbn_missing_class;
};

#define KBN_CAT2(a, b) a##b
#define KBN_CAT(a, b) KBN_CAT2(a, b)
#define KBN_WHERE(file) "tasks/" KBN_VARIANT_NAME "/" file " (or its baseline twin)"

#define KBN_REQUIRE_CLASS(Class, File)                                          \
  static_assert(task_class_present<Class>, KBN_WHERE(File) ": class '" #Class   \
                                                           "' is missing; the " \
                                                           "baseline declares it and a candidate must keep the name")

// Exact signature: the member function pointer of that type must be formable.
#define KBN_REQUIRE_METHOD(Class, Ret, Name, Params, File)                                   \
  template <class C>                                                                         \
  concept KBN_CAT(kbn_sig_, __LINE__) = requires {                                           \
    static_cast<Ret(C::*) Params>(&C::Name);                                                 \
  };                                                                                         \
  static_assert(KBN_CAT(kbn_sig_, __LINE__) < Class >,                                       \
                KBN_WHERE(File) ": class '" #Class "' must declare `" #Ret " " #Name #Params \
                                "` exactly as the baseline does")

#define KBN_REQUIRE_CTOR(Class, File, ...)                                 \
  static_assert(std::is_constructible_v<Class __VA_OPT__(, ) __VA_ARGS__>, \
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

KBN_REQUIRE_CLASS(QKVParallelLinear, "L2/parallel_linear.h");
KBN_REQUIRE_CTOR(QKVParallelLinear, "L2/parallel_linear.h", int64_t, int64_t, int64_t, int64_t, bool, bool,
                 const ParamOptions&, const std::string&);
KBN_REQUIRE_METHOD(QKVParallelLinear, TensorPair, forward, (const Tensor&), "L2/parallel_linear.h");
KBN_REQUIRE_CLASS(MergedColumnParallelLinear, "L2/parallel_linear.h");
KBN_REQUIRE_CTOR(MergedColumnParallelLinear, "L2/parallel_linear.h", int64_t, const std::vector<int64_t>&, bool, bool,
                 const ParamOptions&, const std::string&);
KBN_REQUIRE_METHOD(MergedColumnParallelLinear, TensorPair, forward, (const Tensor&), "L2/parallel_linear.h");
KBN_REQUIRE_CLASS(RowParallelLinear, "L2/parallel_linear.h");
KBN_REQUIRE_CTOR(RowParallelLinear, "L2/parallel_linear.h", int64_t, int64_t, bool, bool, bool, bool,
                 const ParamOptions&, const std::string&);
KBN_REQUIRE_METHOD(RowParallelLinear, TensorPair, forward, (const Tensor&), "L2/parallel_linear.h");

KBN_REQUIRE_CLASS(VocabParallelEmbedding, "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CTOR(VocabParallelEmbedding, "L2/vocab_parallel_embedding.h", int64_t, int64_t, const ParamOptions&,
                 const std::string&);
KBN_REQUIRE_METHOD(VocabParallelEmbedding, Tensor, forward, (const Tensor&), "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CLASS(ParallelLMHead, "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CTOR(ParallelLMHead, "L2/vocab_parallel_embedding.h", int64_t, int64_t, bool, const ParamOptions&,
                 const std::string&);
KBN_REQUIRE_METHOD(ParallelLMHead, Tensor, forward, (const Tensor&), "L2/vocab_parallel_embedding.h");

KBN_REQUIRE_CLASS(Attention, "L2/attention.h");
KBN_REQUIRE_CTOR(Attention, "L2/attention.h", int64_t, int64_t, double, int64_t, const std::string&);
KBN_REQUIRE_METHOD(Attention, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&), "L2/attention.h");

KBN_REQUIRE_CLASS(LlamaAttention, "L2/llama_attention.h");
KBN_REQUIRE_CTOR(LlamaAttention, "L2/llama_attention.h", const LlamaConfig&, int64_t, int64_t, int64_t, double,
                 const RopeScaling&, int64_t, bool, const std::string&, const ParamOptions&);
KBN_REQUIRE_METHOD(LlamaAttention, Tensor, forward, (const Tensor&, const Tensor&), "L2/llama_attention.h");

KBN_REQUIRE_CLASS(LlamaMLP, "L2/llama_mlp.h");
KBN_REQUIRE_CTOR(LlamaMLP, "L2/llama_mlp.h", int64_t, int64_t, const std::string&, bool, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(LlamaMLP, Tensor, forward, (const Tensor&), "L2/llama_mlp.h");

KBN_REQUIRE_CLASS(LlamaDecoderLayer, "L3/llama_decoder_layer.h");
KBN_REQUIRE_CTOR(LlamaDecoderLayer, "L3/llama_decoder_layer.h", const LlamaConfig&, const std::string&,
                 const ParamOptions&);
KBN_REQUIRE_METHOD(LlamaDecoderLayer, TensorPair, forward, (const Tensor&, const Tensor&, const Tensor&),
                   "L3/llama_decoder_layer.h");

KBN_REQUIRE_CLASS(LlamaForCausalLM, "L4/llama.h");
KBN_REQUIRE_CTOR(LlamaForCausalLM, "L4/llama.h", const ModelConfig&, const ParamOptions&);
static_assert(std::is_base_of_v<CausalLM, LlamaForCausalLM>,
              KBN_WHERE("L4/llama.h") ": class 'LlamaForCausalLM' must derive from kbn::CausalLM");

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
    // A call may also read the OpArgs it was built with (host facts such as attention maxima).
    auto checked = [=](Op& o, const Tensors& args) -> Tensors {
      KBN_CHECK(args.size() == nargs, name, ": expected ", nargs, " tensor arguments, got ", args.size());
      if constexpr (std::is_invocable_v<Call, Op&, const Tensors&, const OpArgs&>)
        return call(o, args, a);
      else
        return call(o, args);
    };
    return std::make_unique<Adapter<Op, decltype(checked)>>(std::move(op), checked);
  };
}

// Host maxima for attention launches: from OpArgs ("max_query_len", "max_seq_len") when the caller knows
// them (the kernel bench does, so nothing host-side runs inside its timed call), else read from the metadata
// tensors (a device-to-host copy).
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
  r.add({.name = "rms_norm",
         .class_name = "RMSNorm",
         .level = 1,
         .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "rms_norm", 1,
             [](const OpArgs& a) { return std::make_unique<RMSNorm>(a.get_int("hidden_size"), a.get("eps"), a.opts); },
             [](RMSNorm& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "fused_add_rms_norm",
         .class_name = "RMSNorm",
         .level = 1,
         .header = "L1/rms_norm.h",
         .ctor_args = {"hidden_size", "eps"},
         .args = {"x", "residual"},
         .mutates = {"x", "residual"},
         .make = adapter(
             "fused_add_rms_norm", 2,
             [](const OpArgs& a) { return std::make_unique<RMSNorm>(a.get_int("hidden_size"), a.get("eps"), a.opts); },
             [](RMSNorm& op, const Tensors& t) {
               auto [x, res] = op.forward(t[0], t[1]);
               return Tensors{x, res};
             })});
  r.add({.name = "silu_and_mul",
         .class_name = "SiluAndMul",
         .level = 1,
         .header = "L1/silu_and_mul.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "silu_and_mul", 1, [](const OpArgs&) { return std::make_unique<SiluAndMul>(); },
             [](SiluAndMul& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
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
             })});
  r.add({.name = "embedding",
         .class_name = "Embedding",
         .level = 1,
         .header = "L1/embedding.h",
         .ctor_args = {},
         .args = {"input_ids", "weight"},
         .mutates = {},
         .make = adapter(
             "embedding", 2, [](const OpArgs&) { return std::make_unique<Embedding>(); },
             [](Embedding& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], 0, t[1].size(0))}; }),
         .exact_outputs = true});
  r.add({.name = "linear",
         .class_name = "Linear",
         .level = 1,
         .header = "L1/linear.h",
         .ctor_args = {},
         .args = {"x", "weight", "bias"},
         .mutates = {},
         .make = adapter(
             "linear", 3, [](const OpArgs&) { return std::make_unique<Linear>(); },
             [](Linear& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], t[2])}; })});
  r.add({.name = "all_reduce",
         .class_name = "AllReduce",
         .level = 1,
         .header = "L1/all_reduce.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {"x"},
         .make = adapter(
             "all_reduce", 1, [](const OpArgs&) { return std::make_unique<AllReduce>(); },
             [](AllReduce& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "store_kvcache",
         .class_name = "StoreKVCache",
         .level = 1,
         .header = "L1/store_kvcache.h",
         .ctor_args = {},
         .args = {"key", "value", "key_cache", "value_cache", "slot_mapping"},
         .mutates = {"key_cache", "value_cache"},
         .make = adapter(
             "store_kvcache", 5, [](const OpArgs&) { return std::make_unique<StoreKVCache>(); },
             [](StoreKVCache& op, const Tensors& t) {
               op.forward(t[0], t[1], t[2], t[3], t[4]);
               return Tensors{t[2], t[3]};
             }),
         .exact_outputs = true});
  r.add({.name = "flash_attn_prefill",
         .class_name = "FlashAttnPrefill",
         .level = 1,
         .header = "L1/flash_attn_prefill.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads", "max_query_len (optional)",
                       "max_seq_len (optional)"},
         .args = {"q", "key_cache", "value_cache", "query_start_loc", "seq_lens", "block_tables"},
         .mutates = {},
         .make = adapter(
             "flash_attn_prefill", 6,
             [](const OpArgs& a) {
               return std::make_unique<FlashAttnPrefill>(a.get_int("num_heads"), a.get_int("head_size"), a.get("scale"),
                                                         a.get_int("num_kv_heads"));
             },
             [](FlashAttnPrefill& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_q = a.get_int_or("max_query_len", 0), max_s = a.get_int_or("max_seq_len", 0);
               return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], t[5], max_q ? max_q : host_max_diff(t[3]),
                                         max_s ? max_s : host_max(t[4]))};
             })});
  r.add({.name = "flash_attn_decode",
         .class_name = "FlashAttnDecode",
         .level = 1,
         .header = "L1/flash_attn_decode.h",
         .ctor_args = {"num_heads", "head_size", "scale", "num_kv_heads", "max_seq_len (optional)"},
         .args = {"q", "key_cache", "value_cache", "seq_lens", "block_tables"},
         .mutates = {},
         .make = adapter(
             "flash_attn_decode", 5,
             [](const OpArgs& a) {
               return std::make_unique<FlashAttnDecode>(a.get_int("num_heads"), a.get_int("head_size"), a.get("scale"),
                                                        a.get_int("num_kv_heads"));
             },
             [](FlashAttnDecode& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_s = a.get_int_or("max_seq_len", 0);
               return Tensors{op.forward(t[0], t[1], t[2], t[3], t[4], max_s ? max_s : host_max(t[3]))};
             })});
  r.add({.name = "argmax",
         .class_name = "Argmax",
         .level = 1,
         .header = "L1/argmax.h",
         .ctor_args = {},
         .args = {"logits"},
         .mutates = {},
         .make = adapter(
             "argmax", 1, [](const OpArgs&) { return std::make_unique<Argmax>(); },
             [](Argmax& op, const Tensors& t) { return Tensors{op.forward(t[0])}; }),
         .exact_outputs = true});

  // L2..L4 build from a model config; their layer-0 prefixes make attention read KV cache 0.
  r.add({.name = "qkv_parallel_linear",
         .class_name = "QKVParallelLinear",
         .level = 2,
         .header = "L2/parallel_linear.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "qkv_parallel_linear", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<QKVParallelLinear>(c.hidden_size, c.head_dim, c.num_attention_heads,
                                                          c.num_key_value_heads, c.attention_bias, false, a.opts,
                                                          "model.layers.0.self_attn.qkv_proj");
             },
             [](QKVParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; })});
  r.add({.name = "merged_column_parallel_linear",
         .class_name = "MergedColumnParallelLinear",
         .level = 2,
         .header = "L2/parallel_linear.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "merged_column_parallel_linear", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<MergedColumnParallelLinear>(
                   c.hidden_size, std::vector<int64_t>{c.intermediate_size, c.intermediate_size}, c.mlp_bias, false,
                   a.opts, "model.layers.0.mlp.gate_up_proj");
             },
             [](MergedColumnParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; })});
  r.add({.name = "row_parallel_linear",
         .class_name = "RowParallelLinear",
         .level = 2,
         .header = "L2/parallel_linear.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "row_parallel_linear", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<RowParallelLinear>(c.intermediate_size, c.hidden_size, c.mlp_bias, true, false,
                                                          true, a.opts, "model.layers.0.mlp.down_proj");
             },
             [](RowParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; })});
  r.add({.name = "vocab_parallel_embedding",
         .class_name = "VocabParallelEmbedding",
         .level = 2,
         .header = "L2/vocab_parallel_embedding.h",
         .ctor_args = {},
         .args = {"input_ids"},
         .mutates = {},
         .make = adapter(
             "vocab_parallel_embedding", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<VocabParallelEmbedding>(c.vocab_size, c.hidden_size, a.opts,
                                                               "model.embed_tokens");
             },
             [](VocabParallelEmbedding& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "parallel_lm_head",
         .class_name = "ParallelLMHead",
         .level = 2,
         .header = "L2/vocab_parallel_embedding.h",
         .ctor_args = {},
         .args = {"hidden_states"},
         .mutates = {},
         .make = adapter(
             "parallel_lm_head", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<ParallelLMHead>(c.vocab_size, c.hidden_size, false, a.opts, "lm_head");
             },
             [](ParallelLMHead& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "attention",
         .class_name = "Attention",
         .level = 2,
         .header = "L2/attention.h",
         .ctor_args = {},
         .args = {"query", "key", "value"},
         .mutates = {},
         .make = adapter(
             "attention", 3,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<Attention>(c.num_attention_heads, c.head_dim,
                                                  1.0 / std::sqrt(double(c.head_dim)), c.num_key_value_heads,
                                                  "model.layers.0.self_attn.attn");
             },
             [](Attention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], t[2])}; })});
  r.add({.name = "llama_attention",
         .class_name = "LlamaAttention",
         .level = 2,
         .header = "L2/llama_attention.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states"},
         .mutates = {},
         .make = adapter(
             "llama_attention", 2,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<LlamaAttention>(c, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                                       c.rope_theta, c.rope_scaling, c.max_position_embeddings,
                                                       c.attention_bias, "model.layers.0.self_attn", a.opts);
             },
             [](LlamaAttention& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; })});
  r.add({.name = "llama_mlp",
         .class_name = "LlamaMLP",
         .level = 2,
         .header = "L2/llama_mlp.h",
         .ctor_args = {},
         .args = {"x"},
         .mutates = {},
         .make = adapter(
             "llama_mlp", 1,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<LlamaMLP>(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias,
                                                 "model.layers.0.mlp", a.opts);
             },
             [](LlamaMLP& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "llama_decoder_layer",
         .class_name = "LlamaDecoderLayer",
         .level = 3,
         .header = "L3/llama_decoder_layer.h",
         .ctor_args = {},
         .args = {"positions", "hidden_states", "residual"},
         .mutates = {"hidden_states", "residual"},
         .make = adapter(
             "llama_decoder_layer", 3,
             [](const OpArgs& a) {
               LlamaConfig c = LlamaConfig::from(a.model_config());
               return std::make_unique<LlamaDecoderLayer>(c, "model.layers.0", a.opts);
             },
             [](LlamaDecoderLayer& op, const Tensors& t) {
               auto [h, res] = op.forward(t[0], t[1], t[2]);
               return Tensors{h, res};
             })});
  r.add({.name = "llama_for_causal_lm",
         .class_name = "LlamaForCausalLM",
         .level = 4,
         .header = "L4/llama.h",
         .ctor_args = {},
         .args = {"input_ids", "positions"},
         .mutates = {},
         .make = adapter(
             "llama_for_causal_lm", 2,
             [](const OpArgs& a) { return std::make_unique<LlamaForCausalLM>(a.model_config(), a.opts); },
             [](LlamaForCausalLM& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1])}; }),
         .architectures = {"LlamaForCausalLM"},
         .make_model = [](const ModelConfig& c, const ParamOptions& o) -> std::unique_ptr<CausalLM> {
           return std::make_unique<LlamaForCausalLM>(c, o);
         }});
}

}  // namespace kbn::KBN_VARIANT
