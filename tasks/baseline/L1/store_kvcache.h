#pragma once
// Paged KV store (vLLM reshape_and_cache_flash). Cache layout: [num_blocks, block_size, num_kv_heads,
// head_size]; slot s -> block s / block_size, row s % block_size; slot -1 is skipped (padding tokens).
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class StoreKVCache : public Module {
 public:
  StoreKVCache() = default;
  // key, value: [num_tokens, num_kv_heads, head_size] (token stride may exceed num_kv_heads * head_size);
  // key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size] contiguous;
  // slot_mapping: [num_tokens] i64. Mutates key_cache and value_cache.
  void forward(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
               const Tensor& slot_mapping);
};

}  // namespace kbn::KBN_VARIANT
