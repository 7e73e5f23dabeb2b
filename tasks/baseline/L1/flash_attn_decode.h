#pragma once
// Decode attention over the paged KV cache: one query token per sequence, split along the keys for long
// contexts, GQA-aware (query heads sharing a kv head read it once).
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FlashAttnDecode : public Module {
 public:
  // sliding_window > 0: a query at position i sees keys i - sliding_window + 1 .. i (vLLM's
  // per_layer_sliding_window); logits_soft_cap > 0: scores become cap * tanh(score / cap). The tensor-core kernels
  // apply both (and sinks) and never read a page before a window. The pages may be fp8 e4m3 (--kv-cache-dtype
  // fp8_e4m3) whatever q's dtype, with per-tensor scales (`scales`: vLLM's k_scale / v_scale, 1.0 by default; the
  // key scale folds into the softmax scale, the value scale into the output's normalisation). On Hopper (sm_90) the
  // tensor-core kernel reads them at head sizes 64, 128 and 256 with f16 / bf16 q (half the bytes of 16-bit pages; its
  // mmas run in f16, so bf16 q is rounded to f16 there, saturating at +-65504); other GPUs, and other dtypes or head
  // sizes, read them with the generic kernel.
  FlashAttnDecode(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads, int64_t sliding_window = 0,
        double logits_soft_cap = 0);

  // q: [num_seqs, num_heads, head_size]; caches as in FlashAttnPrefill; seq_lens: [num_seqs] i32;
  // block_tables: [num_seqs, max_blocks_per_seq] i32; max_seq_len: host maximum of seq_lens
  // -> new [num_seqs, num_heads, head_size]
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& seq_lens,
                 const Tensor& block_tables, int64_t max_seq_len, const KVScales& scales = {});
  // With attention sinks (gpt-oss; vLLM's s_aux): sinks [num_heads] (f32, f16 or bf16), a logit per query head that
  // joins the softmax denominator and has no value.
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& seq_lens,
                 const Tensor& block_tables, int64_t max_seq_len, const Tensor& sinks, const KVScales& scales = {});

  int64_t num_heads() const { return num_heads_; }
  int64_t head_size() const { return head_size_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  double scale() const { return scale_; }
  int64_t sliding_window() const { return sliding_window_; }
  double logits_soft_cap() const { return logits_soft_cap_; }

 private:
  Tensor run(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& seq_lens,
             const Tensor& block_tables, int64_t max_seq_len, const Tensor* sinks, const KVScales& scales);

  int64_t num_heads_, head_size_, num_kv_heads_;
  double scale_;
  int64_t sliding_window_;
  double logits_soft_cap_;
};

}  // namespace kbn::KBN_VARIANT
