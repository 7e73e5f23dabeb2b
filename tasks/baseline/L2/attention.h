#pragma once
// The paged attention layer (vLLM vllm/attention/layer.py Attention): stores this step's keys and values
// in the layer's KV cache, then attends. Metadata and caches come from the forward context; the layer
// finds its own cache by the layer index in its prefix ("model.layers.7.self_attn.attn" -> 7).
#include <string>

#include "L1/flash_attn_decode.h"
#include "L1/flash_attn_prefill.h"
#include "L1/store_kvcache.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Attention : public Module {
 public:
  Attention(int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads, const std::string& prefix);

  // query: [num_tokens, num_heads * head_size]; key, value: [num_tokens, num_kv_heads * head_size] (row
  // strides may exceed the width: views into a fused qkv tensor) -> [num_tokens, num_heads * head_size]
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value);

  int64_t layer_index() const { return layer_index_; }

 private:
  int64_t num_heads_, head_size_, num_kv_heads_, layer_index_;
  StoreKVCache store_kvcache_;
  FlashAttnPrefill prefill_;
  FlashAttnDecode decode_;
};

}  // namespace kbn::KBN_VARIANT
