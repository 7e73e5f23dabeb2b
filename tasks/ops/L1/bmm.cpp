// bmm: class Bmm (tasks/baseline/L1/bmm.h: one cuBLASLt strided-batched GEMM), the per-head products of multi-head
// latent attention (vLLM's MLA runs torch.bmm there); oracle reference::linear (tasks/reference/linear.cpp) per batch.
#include "L1/bmm.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(Bmm)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(Bmm, "L1/bmm.h");
KBN_REQUIRE_CTOR(Bmm, "L1/bmm.h");
KBN_REQUIRE_METHOD(Bmm, void, forward, (const Tensor&, const Tensor&, const Tensor&), "L1/bmm.h");

namespace {

// The two absorbed up-projections of one MLA layer on one rank, batched over its heads, as DeepSeek-V2's decode
// runs them: each head's q_nope into the latent space through W_UK (x a per-head view into the query projection's
// [T, H, qk_nope + rope] output, out the latent part of each head of the absorbed query [T, H, kv_lora_rank + rope],
// whose rope part is written by others), and each head's latent attention output back to v_head_dim through W_UV
// (x a per-head view into [T, H, kv_lora_rank], out one into [T, H, v_head_dim]).
std::vector<BenchCase> bmm_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mla) return {};
  const MlaShape& a = *m.mla;
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), H = a.num_heads, P = a.qk_nope_head_dim, R = a.qk_rope_head_dim,
                L = a.kv_lora_rank, V = a.v_head_dim;
  struct Product {
    const char* name;
    int64_t k, n;       // x [H, T, k] @ weight [H, n, k]^T
    int64_t x_width;    // x: columns [0, k) of each head of a [T, H, x_width] tensor
    int64_t out_width;  // out: columns [0, n) of each head of a [T, H, out_width] tensor
  };
  const Product products[] = {{"W_UK q_nope->latent", P, L, P + R, L + R}, {"W_UV latent->v", L, V, L, V}};
  std::vector<BenchCase> out;
  for (const Product& p : products) {
    for (int64_t T : cases::token_counts(o)) {
      const int64_t K = p.k, N = p.n, XW = p.x_width, OW = p.out_width;
      BenchCase b = cases::base("bmm", m, T, dt);
      b.label = std::string(p.name) + " T=" + cases::str(T) + " H=" + cases::str(H) + " N=" + cases::str(N) +
                " K=" + cases::str(K);
      b.make_inputs = [=](Device d, uint64_t seed) {
        const Tensor xs = cases::normal({T, H, XW}, dt, d, seed, "x", 1.0);
        const Tensor os = cases::normal({T, H, OW}, dt, d, seed, "out", 1.0);
        return std::vector<Tensor>{xs.as_strided({H, T, K}, {XW, H * XW, 1}, xs.offset()),
                                   cases::normal({H, N, K}, dt, d, seed, "weight", cases::kWeightStd),
                                   os.as_strided({H, T, N}, {OW, H * OW, 1}, os.offset())};
      };
      b.bytes = (H * T * K + H * N * K + H * T * N) * es;  // x and weight read, out written
      b.flops = 2 * H * T * N * K;
      b.input_bytes = (T * H * XW + H * N * K + T * H * OW) * es;
      b.output_numel = H * T * N;
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "bmm",
         .class_name = "Bmm",
         .level = 1,
         .header = "L1/bmm.h",
         .ctor_args = {},
         .args = {"x", "weight", "out"},
         .mutates = {"out"},
         .make = adapter(
             "bmm", 3, [](const OpArgs&) { return std::make_unique<Bmm>(); },
             [](Bmm& op, const Tensors& t) {
               op.forward(t[0], t[1], t[2]);
               return Tensors{t[2]};
             }),
         // NOTE: cuBLASLt's kernels (nvjet, xmma, cutlass-based ones) are declared by linear, which runs far more of
         // them; a kernel trace attributes these GEMMs to linear (declaring the same names here would make every
         // cuBLAS kernel "bmm / linear (shared kernel)").
         .kernels = {},
         .cases = bmm_cases});
}

}  // namespace kbn::KBN_VARIANT
