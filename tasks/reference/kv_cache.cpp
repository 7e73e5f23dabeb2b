// Oracle: paged KV store (vLLM reshape_and_cache_flash).
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kOp = "reference::reshape_and_cache";

void check_kv(const Tensor& t, const char* arg) {
  check_rank(t, kOp, arg, 3, "[num_tokens, num_kv_heads, head_size]");
  check_dtype(t, kOp, arg, {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(t, kOp, arg);
}

void check_cache(const Tensor& t, const char* arg) {
  check_rank(t, kOp, arg, 4, "[num_blocks, block_size, num_kv_heads, head_size]");
  check_dtype(t, kOp, arg, {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3});
  check_cpu(t, kOp, arg);
}

}  // namespace

void reshape_and_cache(const Tensor& key, const Tensor& value, Tensor& key_cache, Tensor& value_cache,
                       const Tensor& slot_mapping, const KVScales& scales) {
  check_kv(key, "key");
  check_kv(value, "value");
  KBN_CHECK(value.shape() == key.shape(), kOp, ": argument 'value' ", value.str(), " must have the shape of 'key' ",
            key.str());
  check_cache(key_cache, "key_cache");
  check_cache(value_cache, "value_cache");
  KBN_CHECK(value_cache.shape() == key_cache.shape(), kOp, ": argument 'value_cache' ", value_cache.str(),
            " must have the shape of 'key_cache' ", key_cache.str());
  check_size(key_cache, kOp, "key_cache", 2, key.size(1), "num_kv_heads = key.size(1)");
  check_size(key_cache, kOp, "key_cache", 3, key.size(2), "head_size = key.size(2)");
  check_same_dtype(value_cache, key_cache, kOp, "value_cache", "key_cache");
  check_kv_scales(kOp, scales, key_cache.dtype());
  const int64_t num_tokens = key.size(0), block_size = key_cache.size(1);
  const int64_t num_slots = key_cache.size(0) * block_size;
  check_rank(slot_mapping, kOp, "slot_mapping", 1, "[num_tokens]");
  check_dtype(slot_mapping, kOp, "slot_mapping", {DType::i64, DType::i32});
  check_cpu(slot_mapping, kOp, "slot_mapping");
  check_size(slot_mapping, kOp, "slot_mapping", 0, num_tokens, "num_tokens = key.size(0)");

  const std::vector<int64_t> slots = slot_mapping.to_ints();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slots[size_t(t)];
    KBN_CHECK(s >= -1 && s < num_slots, kOp, ": argument 'slot_mapping': token ", t, " has slot ", s,
              ", outside [0, num_blocks * block_size = ", num_slots, ") and not -1 (skip)");
  }
  // NOTE: row views and copy_, not doubles: with matching dtypes copy_ moves raw bits, so the store is exact
  // (NaN payloads and -0 included); a cache of another dtype gets each element rounded once. A scaled row is divided
  // in f32 (float(x) / scale, as the kernels do) and then rounded once by copy_.
  auto store = [](const Tensor& src, Tensor dst, float scale) {
    if (scale == 1.f) {
      dst.copy_(src);
      return;
    }
    std::vector<float> row = src.to_floats();
    for (float& x : row) x = x / scale;
    dst.copy_(Tensor::from_floats(row, src.shape(), DType::f32));
  };
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slots[size_t(t)];
    if (s == -1) continue;
    const int64_t block = s / block_size, row = s % block_size;
    store(key.select(0, t), key_cache.select(0, block).select(0, row), scales.k);
    store(value.select(0, t), value_cache.select(0, block).select(0, row), scales.v);
  }
}

}  // namespace kbn::reference
