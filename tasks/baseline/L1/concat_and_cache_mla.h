#pragma once
// The paged latent cache store of multi-head latent attention (vLLM's concat_and_cache_mla, csrc/cache_kernels.cu):
// each token's compressed kv_c and its rotated k_pe are written side by side as one row. Cache layout: [num_blocks,
// block_size, kv_lora_rank + rope_dim]; slot s -> block s / block_size, row s % block_size; slot -1 is skipped
// (padding tokens). A slot outside the cache is an error (on the GPU reported through kbn/device_errors.h, that
// token's row left unwritten).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class ConcatAndCacheMLA : public Module {
 public:
  ConcatAndCacheMLA() = default;
  // kv_c: [num_tokens, kv_lora_rank], k_pe: [num_tokens, rope_dim] (each with a free token stride: DeepSeek's k_pe
  // is a view into kv_a_proj_with_mqa's output); kv_cache: [num_blocks, block_size, kv_lora_rank + rope_dim]
  // contiguous, of their dtype; slot_mapping: [num_tokens] i64. Mutates kv_cache.
  void forward(const Tensor& kv_c, const Tensor& k_pe, const Tensor& kv_cache, const Tensor& slot_mapping);
};

}  // namespace kbn::KBN_VARIANT
