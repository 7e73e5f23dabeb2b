// linear: class Linear (tasks/baseline/L1/linear.h: cuBLASLt, and a GEMV for one token), oracle
// tasks/reference/linear.cpp.
#include "L1/linear.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Linear)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Linear, "L1/linear.h");
KBN_REQUIRE_METHOD(Linear, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&), "L1/linear.h");

namespace {

// The GEMMs one rank of the model runs: the attention projections and the dense MLP where the model has
// them, and the LM head.
std::vector<BenchCase> linear_cases(const ModelView& m, const CaseOptions& o) {
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt));
  struct Gemm {
    const char* name;
    int64_t n, k;
  };
  std::vector<Gemm> gemms;
  if (m.attention) {
    const AttentionShape& a = *m.attention;
    gemms.push_back({"qkv", (a.num_heads + 2 * a.num_kv_heads) * a.head_dim, m.hidden_size});
    gemms.push_back({"o", m.hidden_size, a.num_heads * a.head_dim});
  }
  if (m.intermediate_size) {
    gemms.push_back({"gate_up", 2 * *m.intermediate_size, m.hidden_size});
    gemms.push_back({"down", m.hidden_size, *m.intermediate_size});
  }
  gemms.push_back({"lm_head", m.vocab_size, m.hidden_size});
  std::vector<BenchCase> out;
  for (const Gemm& g : gemms) {
    for (int64_t T : cases::token_counts(o)) {
      const int64_t N = g.n, K = g.k;
      BenchCase b = cases::base("linear", m, T, dt);
      b.label = std::string(g.name) + " T=" + cases::str(T) + " N=" + cases::str(N) + " K=" + cases::str(K);
      b.make_inputs = [=](Device d, uint64_t seed) {
        return std::vector<Tensor>{cases::normal({T, K}, dt, d, seed, "x", 1.0),
                                   cases::normal({N, K}, dt, d, seed, "weight", cases::kWeightStd),
                                   Tensor()};  // no bias
      };
      b.bytes = (T * K + N * K + T * N) * es;
      b.flops = 2 * T * N * K;
      b.input_bytes = (T * K + N * K) * es;
      b.output_numel = T * N;
      b.gemm = std::array<int64_t, 3>{T, N, K};
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "linear",
         .class_name = "Linear",
         .level = 1,
         .header = "L1/linear.h",
         .ctor_args = {},
         .args = {"x", "weight", "bias"},
         .mutates = {},
         .make = adapter(
             "linear", 3, [](const OpArgs&) { return std::make_unique<Linear>(); },
             [](Linear& op, const Tensors& t) { return Tensors{op.forward(t[0], t[1], t[2])}; }),
         // kb-nano's GEMV and cuBLASLt's kernels (nvjet, xmma, cutlass-based ones).
         .kernels = {"gemv_kernel", "gemm", "nvjet", "xmma", "cutlass", "cublas"},
         .cases = linear_cases});
}

}  // namespace kbn::KBN_VARIANT
