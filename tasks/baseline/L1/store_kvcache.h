#pragma once
// Paged KV store (vLLM reshape_and_cache_flash). Cache layout: [num_blocks, block_size, num_kv_heads,
// head_size]; slot s -> block s / block_size, row s % block_size; slot -1 is skipped (padding tokens).
#include "kbn/cache_spec.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class StoreKVCache : public Module {
 public:
  StoreKVCache() = default;
  // key, value: [num_tokens, num_kv_heads, head_size] (token stride may exceed num_kv_heads * head_size);
  // key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size] contiguous, of key's dtype or fp8 e4m3
  // (vLLM's kv_cache_dtype "fp8_e4m3": each element float(x) / scale, rounded to nearest even, saturated to +-448);
  // slot_mapping: [num_tokens] i64; scales: vLLM's k_scale / v_scale (fp8 caches only: kbn::check_kv_scales).
  // Mutates key_cache and value_cache.
  void forward(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
               const Tensor& slot_mapping, const KVScales& scales = {});
};

}  // namespace kbn::KBN_VARIANT
