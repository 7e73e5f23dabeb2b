// qkv_parallel_linear, merged_column_parallel_linear, row_parallel_linear: the tensor-parallel linears of
// tasks/baseline/L2/parallel_linear.h, built for layer 0 of any model with attention and an MLP (dense, or one
// expert's shapes when every MLP is a mixture of experts), or Mamba-2's in_proj and out_proj.
#include <optional>

#include "L2/parallel_linear.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(ColumnParallelLinear)
KBN_FALLBACK_CLASS(MergedColumnParallelLinear)
KBN_FALLBACK_CLASS(QKVParallelLinear)
KBN_FALLBACK_CLASS(RowParallelLinear)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

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

namespace {

const AttentionShape& attention_of(const ModelView& m, const char* op) {
  KBN_CHECK(m.attention, op, ": config ", m.config->source(), " has no attention ('num_attention_heads')");
  return *m.attention;
}
// The MLP size the gate/up and down linears are built for: the dense MLP's, or, in a model whose every MLP is a
// mixture of experts (Mixtral), one expert's (its gate/up and down projections have these shapes).
std::optional<int64_t> mlp_size(const ModelView& m) {
  if (m.intermediate_size) return m.intermediate_size;
  if (m.moe) return m.moe->intermediate_size;
  if (m.mamba) return m.mamba->intermediate_size;  // out_proj [I -> H]: a down projection's shape
  return std::nullopt;
}

int64_t intermediate_of(const ModelView& m, const char* op) {
  const std::optional<int64_t> I = mlp_size(m);
  KBN_CHECK(I, op, ": config ", m.config->source(), " has no MLP ('intermediate_size')");
  return *I;
}

// The merged column's output sizes: gate and up of the MLP, or Mamba-2's in_proj [z (I) | xBC (conv_dim) | dt
// (heads)] (vLLM builds it as a MergedColumnParallelLinear).
std::vector<int64_t> merged_sizes(const ModelView& m, const char* op) {
  if (m.mamba) return {m.mamba->intermediate_size, m.mamba->conv_dim(), m.mamba->num_heads};
  const int64_t I = intermediate_of(m, op);
  return {I, I};
}

}  // namespace

KBN_REGISTER_OPS(r) {
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
               const ModelView m = view_of(a);
               const AttentionShape& at = attention_of(m, "qkv_parallel_linear");
               return std::make_unique<QKVParallelLinear>(m.hidden_size, at.head_dim, at.total_num_heads,
                                                          at.total_num_kv_heads,
                                                          a.model_config().get_bool("attention_bias", false), false,
                                                          a.opts, "model.layers.0.self_attn.qkv_proj");
             },
             [](QKVParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!m.attention) return {};
           const AttentionShape& at = *m.attention;
           const int64_t out = (at.num_heads + 2 * at.num_kv_heads) * at.head_dim;
           return cases::block_cases("qkv_parallel_linear", m, o,
                                     {.params = m.hidden_size * out, .in_features = m.hidden_size, .out_features = out});
         }});
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
               const ModelView m = view_of(a);
               return std::make_unique<MergedColumnParallelLinear>(
                   m.hidden_size, merged_sizes(m, "merged_column_parallel_linear"),
                   a.model_config().get_bool(m.mamba ? "use_bias" : "mlp_bias", false), false, a.opts,
                   m.mamba ? "backbone.layers.0.mixer.in_proj" : "model.layers.0.mlp.gate_up_proj");
             },
             [](MergedColumnParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!mlp_size(m)) return {};
           int64_t out = 0;
           for (int64_t n : merged_sizes(m, "merged_column_parallel_linear")) out += n;
           return cases::block_cases("merged_column_parallel_linear", m, o,
                                     {.params = m.hidden_size * out, .in_features = m.hidden_size, .out_features = out});
         }});
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
               const ModelView m = view_of(a);
               return std::make_unique<RowParallelLinear>(intermediate_of(m, "row_parallel_linear"), m.hidden_size,
                                                          a.model_config().get_bool(m.mamba ? "use_bias" : "mlp_bias", false),
                                                          true, false, true, a.opts,
                                                          m.mamba ? "backbone.layers.0.mixer.out_proj"
                                                                  : "model.layers.0.mlp.down_proj");
             },
             [](RowParallelLinear& op, const Tensors& t) { return Tensors{op.forward(t[0]).first}; }),
         .cases = [](const ModelView& m, const CaseOptions& o) -> std::vector<BenchCase> {
           if (!mlp_size(m)) return {};
           const int64_t I = *mlp_size(m);
           return cases::block_cases("row_parallel_linear", m, o,
                                     {.params = I * m.hidden_size, .in_features = I, .out_features = m.hidden_size});
         }});
}

}  // namespace kbn::KBN_VARIANT
