// gather_cache: class GatherCache (tasks/baseline/L1/gather_cache.h), each sequence's paged-cache rows in position
// order (vLLM's cp_gather_cache, for MLA's decompressed prefill); oracle reference::gather_cache
// (tasks/reference/attention.cpp).
#include <algorithm>

#include "L1/gather_cache.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(GatherCache)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(GatherCache, "L1/gather_cache.h");
KBN_REQUIRE_CTOR(GatherCache, "L1/gather_cache.h");
KBN_REQUIRE_METHOD(GatherCache, Tensor, forward, (const Tensor&, const Tensor&, const Tensor&, int64_t),
                   "L1/gather_cache.h");

namespace {

// A prefill step's sequences over the latent cache of a model with MLA: T tokens in sequences of up to 2048 rows
// (the last one shorter), pages scattered over the cache.
std::vector<BenchCase> gather_cache_cases(const ModelView& m, const CaseOptions& o) {
  if (!m.mla) return {};
  const DType dt = o.dtype;
  const int64_t es = int64_t(dtype_size(dt)), W = m.mla->latent_size(), bs = cases::kKvBlockSize;
  std::vector<BenchCase> out;
  for (int64_t T : cases::token_counts(o)) {
    std::vector<int32_t> lens;
    for (int64_t left = T; left > 0; left -= 2048) lens.push_back(int32_t(std::min<int64_t>(left, 2048)));
    const int64_t S = int64_t(lens.size()), Lmax = lens.front(), bps = cases::ceil_div(Lmax, bs), blocks = S * bps;
    BenchCase b = cases::base("gather_cache", m, T, dt);
    b.label = "T=" + cases::str(T) + " seqs=" + cases::str(S) + " width=" + cases::str(W);
    b.args.values = {{"max_seq_len", double(Lmax)}};
    b.make_inputs = [=](Device d, uint64_t seed) {
      return std::vector<Tensor>{cases::normal({blocks, bs, W}, dt, d, seed, "kv_cache", 1.0),
                                 cases::permutation_prefix(blocks, {S, bps}, DType::i32, d, seed, "block_tables"),
                                 cases::filled_i32(lens, d)};
    };
    // The sequences' rows read and their slots written (padding rows written as zeros).
    b.bytes = T * W * es + S * Lmax * W * es + S * bps * 4 + S * 4;
    b.flops = 0;
    b.input_bytes = blocks * bs * W * es + S * bps * 4 + S * 4;
    b.output_numel = S * Lmax * W;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

KBN_REGISTER_OPS(r) {
  r.add({.name = "gather_cache",
         .class_name = "GatherCache",
         .level = 1,
         .header = "L1/gather_cache.h",
         .ctor_args = {"max_seq_len (optional)"},
         .args = {"kv_cache", "block_tables", "seq_lens"},
         .mutates = {},
         .make = adapter(
             "gather_cache", 3, [](const OpArgs&) { return std::make_unique<GatherCache>(); },
             [](GatherCache& op, const Tensors& t, const OpArgs& a) {
               const int64_t max_s = a.get_int_or("max_seq_len", 0);
               return Tensors{op.forward(t[0], t[1], t[2], max_s ? max_s : host_max(t[2]))};
             }),
         .kernels = {"gather_cache"},
         .cases = gather_cache_cases,
         .exact_outputs = true});
}

}  // namespace kbn::KBN_VARIANT
