#include "kbn/cache_spec.h"

#include "kbn/error.h"
#include "kbn/format.h"

namespace kbn {

LayerCacheSpec LayerCacheSpec::paged_kv(int64_t num_kv_heads, int64_t head_size, DType dtype, int64_t sliding_window) {
  KBN_CHECK(num_kv_heads > 0 && head_size > 0, "LayerCacheSpec::paged_kv: need positive num_kv_heads and head_size, ",
            "got ", num_kv_heads, " and ", head_size);
  KBN_CHECK(sliding_window >= 0, "LayerCacheSpec::paged_kv: sliding_window must be >= 0 (0: none), got ",
            sliding_window);
  LayerCacheSpec s;
  s.kind = Kind::paged_kv;
  s.dtype = dtype;
  s.num_kv_heads = num_kv_heads;
  s.head_size = head_size;
  s.sliding_window = sliding_window;
  return s;
}

LayerCacheSpec LayerCacheSpec::paged_latent(int64_t latent_size, DType dtype) {
  KBN_CHECK(latent_size > 0, "LayerCacheSpec::paged_latent: latent_size must be positive, got ", latent_size);
  LayerCacheSpec s;
  s.kind = Kind::paged_latent;
  s.dtype = dtype;
  s.latent_size = latent_size;
  return s;
}

const char* cache_kind_name(LayerCacheSpec::Kind kind) {
  switch (kind) {
    case LayerCacheSpec::Kind::paged_kv:
      return "paged K/V";
    case LayerCacheSpec::Kind::paged_latent:
      return "paged latent";
    case LayerCacheSpec::Kind::state:
      return "per-sequence state";
  }
  return "?";
}

int64_t LayerCacheSpec::bytes_per_token() const {
  const int64_t es = int64_t(dtype_size(dtype));
  if (kind == Kind::paged_kv) return 2 * num_kv_heads * head_size * es;
  if (kind == Kind::paged_latent) return latent_size * es;
  return 0;
}

int64_t LayerCacheSpec::bytes_per_sequence() const {
  if (kind != Kind::state) return 0;
  int64_t n = 0;
  for (const Shape& s : state_shapes) n += shape_numel(s);
  return n * int64_t(dtype_size(dtype));
}

std::string LayerCacheSpec::describe() const {
  std::string d = cache_kind_name(kind);
  if (kind == Kind::paged_kv) {
    d += " " + std::to_string(num_kv_heads) + " x " + std::to_string(head_size);
  } else if (kind == Kind::paged_latent) {
    d += " " + std::to_string(latent_size);
  } else {
    for (const Shape& s : state_shapes) d += " " + shape_str(s);
  }
  d += std::string(" ") + dtype_name(dtype);
  if (sliding_window > 0) d += ", window " + std::to_string(sliding_window);
  return d;
}

int64_t paged_bytes_per_block(const std::vector<LayerCacheSpec>& specs, int64_t block_size) {
  int64_t b = 0;
  for (const auto& s : specs) b += s.bytes_per_token() * block_size;
  return b;
}

}  // namespace kbn
