#pragma once
// Causal varlen attention over the paged KV cache, for prefill and chunked prefill (the role of
// flash_attn_varlen_func with a block table in vLLM's FlashAttention backend). GQA by head grouping.
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FlashAttnPrefill : public Module {
 public:
  // sliding_window > 0: a query at position i sees keys i - sliding_window + 1 .. i (vLLM's
  // per_layer_sliding_window); logits_soft_cap > 0: scores become cap * tanh(score / cap). The tensor-core kernels
  // apply both (and sinks) and never read a page before a window. The pages may be fp8 e4m3 (--kv-cache-dtype
  // fp8_e4m3; per-tensor `scales`, vLLM's k_scale / v_scale, 1.0 by default: the key scale folds into the softmax
  // scale, the value scale into the output's normalisation) whatever q's dtype: on CUDA with 16-bit q the
  // tensor-core kernels widen them to f16 in shared memory (Hopper's TMA/wgmma kernel at heads 64 and 128, the
  // mma.sync kernel otherwise); f32 q, the generic kernel.
  FlashAttnPrefill(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads, int64_t sliding_window = 0,
        double logits_soft_cap = 0);

  // q: [num_tokens, num_heads, head_size]; key_cache: [num_blocks, block_size, num_kv_heads, head_size];
  // value_cache: [num_blocks, block_size, num_kv_heads, head_size_v] (head_size_v may differ from head_size, as
  // flash_attn_varlen_func's v may); query_start_loc: [num_seqs + 1] i32; seq_lens: [num_seqs] i32 (cached + new
  // keys, the new ones already stored); block_tables: [num_seqs, max_blocks_per_seq] i32; max_query_len /
  // max_seq_len: maxima over the batch (host values, used for the launch grid) -> new [num_tokens, num_heads,
  // head_size_v]
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& query_start_loc,
                 const Tensor& seq_lens, const Tensor& block_tables, int64_t max_query_len, int64_t max_seq_len,
                 const KVScales& scales = {});
  // With attention sinks (gpt-oss; vLLM's s_aux): sinks [num_heads] (f32, f16 or bf16), a logit per query head that
  // joins the softmax denominator and has no value.
  Tensor forward(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& query_start_loc,
                 const Tensor& seq_lens, const Tensor& block_tables, int64_t max_query_len, int64_t max_seq_len,
                 const Tensor& sinks, const KVScales& scales = {});

  // Whether values narrower than keys run on tensor cores for q of dtype `dt` on `device` (16-bit pages of 8..64 keys):
  // keys 192 / values 128 on Hopper's kernel. Elsewhere such values take the generic kernel, and a caller that can
  // pad its values to the keys' width (DeepSeek's MLA prefill) runs faster padded.
  static bool value_width_on_tensor_cores(DType dt, int64_t head_size, int64_t head_size_v, Device device);

  int64_t num_heads() const { return num_heads_; }
  int64_t head_size() const { return head_size_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  double scale() const { return scale_; }
  int64_t sliding_window() const { return sliding_window_; }
  double logits_soft_cap() const { return logits_soft_cap_; }

 private:
  Tensor run(const Tensor& q, const Tensor& key_cache, const Tensor& value_cache, const Tensor& query_start_loc,
             const Tensor& seq_lens, const Tensor& block_tables, int64_t max_query_len, int64_t max_seq_len,
             const Tensor* sinks, const KVScales& scales);

  int64_t num_heads_, head_size_, num_kv_heads_;
  double scale_;
  int64_t sliding_window_;
  double logits_soft_cap_;
};

}  // namespace kbn::KBN_VARIANT
