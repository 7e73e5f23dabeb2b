#pragma once
// FusedMlaRopeCache (kb-nano's; the MLA counterpart of FusedRopeKVCache): what DeepSeek's multi-head latent attention
// does between its projections and attention, in one kernel per step:
//   kv_c_normed = rms_norm(kv_a[:, :kv_lora_rank], norm_weight)           (kv_a_layernorm)
//   q[:, h, nope:] and k_pe = kv_a[:, kv_lora_rank:] rotated, GPT-J pairs  (rotary_embedding, DeepSeek's rope)
//   kv_cache[slot] = kv_c_normed | k_pe                                    (concat_and_cache_mla)
//   q_abs[:, h, kv_lora_rank:] = the decode tokens' rotated q rope part    (the absorbed decode's query tail)
// The same bits as those four ops: the norm in rms_norm's summation order (one 16-byte vector per thread, then the
// block sum), the rotation through kbn/rope.cuh, rounding points unchanged. At one decode token this is one launch
// where the separate ops take four (DeepSeek-V2-Lite: 81 kernels fewer per step).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class FusedMlaRopeCache : public Module {
 public:
  // num_heads: this rank's query heads; qk_nope_head_dim / qk_rope_head_dim: a query head is [nope | rope];
  // kv_lora_rank: the latent width; eps: kv_a_layernorm's. Errors name the argument.
  FusedMlaRopeCache(int64_t num_heads, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim, int64_t kv_lora_rank,
                    double eps);

  // kv_a: [num_tokens, kv_lora_rank + rope] (last dim contiguous, any row stride): kv_a_proj_with_mqa's output, read
  // only; q: [num_tokens, num_heads, nope + rope] (last dim contiguous, any token and head strides): its rope part
  // rotated in place; positions: [num_tokens] i64; cos_sin_cache: [max_position, rope] (cos | sin, the rotary's table);
  // norm_weight: [kv_lora_rank]; kv_cache: [num_blocks, block_size, kv_lora_rank + rope] contiguous; slot_mapping:
  // [num_tokens] i64 (-1: not stored; a slot outside the cache is an error, on the GPU reported through
  // kbn/device_errors.h); q_abs: undefined or [num_decode, num_heads, kv_lora_rank + rope] (last dim contiguous):
  // the last num_decode tokens' rotated rope parts are also written to q_abs[:, :, kv_lora_rank:]. All tensors of one
  // dtype (f32, f16, bf16) but positions and slot_mapping. Mutates q, kv_cache and q_abs. A position outside
  // [0, max_position) leaves its token's q and k_pe unrotated on the GPU, as rotary_embedding does (the CPU refuses it).
  void forward(const Tensor& kv_a, const Tensor& q, const Tensor& positions, const Tensor& cos_sin_cache,
               const Tensor& norm_weight, const Tensor& kv_cache, const Tensor& slot_mapping,
               const Tensor& q_abs = {});

  // Whether the GPU kernel takes these widths: the latent in whole 16-byte vectors, at most 256 of them (bf16 / f16
  // up to 2048, f32 up to 1024), kv_a rows of whole 16-byte vectors, an even rope width. Callers run the four ops
  // otherwise; forward refuses other widths on the GPU by name.
  static bool kernel_supports(DType dtype, int64_t kv_lora_rank, int64_t qk_rope_head_dim);

 private:
  int64_t num_heads_, nope_, rope_, rank_;
  double eps_;
};

}  // namespace kbn::KBN_VARIANT
