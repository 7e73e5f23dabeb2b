#include "kbn/cache_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

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

KVCacheGroups kv_cache_groups(const std::vector<LayerCacheSpec>& specs) {
  KVCacheGroups g;
  g.layer_group.assign(specs.size(), -1);
  g.layer_tensor.assign(specs.size(), -1);
  std::map<int64_t, std::vector<size_t>> by_window;  // ascending: full attention (0) first
  for (size_t l = 0; l < specs.size(); ++l)
    if (specs[l].kind != LayerCacheSpec::Kind::state) by_window[specs[l].sliding_window].push_back(l);
  if (by_window.empty()) {  // no paged layers (a recurrent model): one group of none, so block tables stay uniform
    g.windows.push_back(0);
    return g;
  }
  if (by_window.size() == 1) {
    g.windows.push_back(by_window.begin()->first);
    for (const size_t l : by_window.begin()->second) {
      g.layer_group[l] = 0;
      g.layer_tensor[l] = int32_t(g.num_tensors++);
    }
    return g;
  }
  size_t first = SIZE_MAX;
  for (const auto& [w, layers] : by_window) {
    for (const size_t l : layers) {
      if (first == SIZE_MAX) first = l;
      const LayerCacheSpec &a = specs[first], &b = specs[l];
      KBN_CHECK(a.kind == b.kind && a.dtype == b.dtype && a.num_kv_heads == b.num_kv_heads &&
                    a.head_size == b.head_size && a.latent_size == b.latent_size,
                "KV cache groups: layers with different sliding windows share pool tensors, so their pages must ",
                "match; layer ", first, " has ", a.describe(), ", layer ", l, " ", b.describe());
    }
  }
  size_t size = SIZE_MAX;
  for (const auto& [w, layers] : by_window) size = std::min(size, layers.size());
  for (const auto& [w, layers] : by_window) {
    for (size_t at = 0; at < layers.size(); at += size) {
      const int32_t group = int32_t(g.windows.size());
      g.windows.push_back(w);
      for (size_t j = at; j < std::min(layers.size(), at + size); ++j) {
        g.layer_group[layers[j]] = group;
        g.layer_tensor[layers[j]] = int32_t(j - at);
      }
    }
  }
  g.num_tensors = int64_t(size);
  return g;
}

std::optional<DType> parse_kv_cache_dtype(const std::string& value, const std::string& what) {
  if (value == "auto") return std::nullopt;
  if (value == "fp8" || value == "fp8_e4m3") return DType::fp8e4m3;
  KBN_FAIL(what, ": expected auto, fp8 or fp8_e4m3, got '", value, "'",
           value == "fp8_e5m2" ? " (no kernel reads e5m2 pages; fp8_e4m3 is the fp8 format here)" : "");
}

void check_kv_scales(const char* op, const KVScales& scales, DType pages) {
  for (const auto& [value, name] : {std::pair{scales.k, "k_scale"}, std::pair{scales.v, "v_scale"}}) {
    KBN_CHECK(std::isfinite(value) && value > 0.f, op, ": argument '", name,
              "' must be a finite positive per-tensor scale, got ", value);
    KBN_CHECK(value == 1.f || pages == DType::fp8e4m3, op, ": argument '", name, "' is ", value, ", but the pages are ",
              dtype_name(pages), ": only fp8 e4m3 pages (--kv-cache-dtype fp8_e4m3) are scaled; 16-bit pages take 1.0");
  }
}

std::vector<LayerCacheSpec> with_kv_cache_dtype(std::vector<LayerCacheSpec> specs, std::optional<DType> dtype) {
  if (!dtype) return specs;
  for (size_t l = 0; l < specs.size(); ++l) {
    LayerCacheSpec& s = specs[l];
    KBN_CHECK(s.kind != LayerCacheSpec::Kind::paged_latent, "kv_cache_dtype ", dtype_name(*dtype), ": layer ", l,
              " keeps a ", s.describe(), " cache, which has no ", dtype_name(*dtype),
              " path (the latent kernels read 16-bit rows); use auto");
    if (s.kind == LayerCacheSpec::Kind::paged_kv) s.dtype = *dtype;
  }
  return specs;
}

int64_t paged_bytes_per_block(const std::vector<LayerCacheSpec>& specs, int64_t block_size) {
  const KVCacheGroups groups = kv_cache_groups(specs);
  std::vector<int64_t> tensor_bytes(size_t(groups.num_tensors), 0);
  for (size_t l = 0; l < specs.size(); ++l)
    if (groups.layer_tensor[l] >= 0) tensor_bytes[size_t(groups.layer_tensor[l])] = specs[l].bytes_per_token();
  int64_t b = 0;
  for (const int64_t t : tensor_bytes) b += t * block_size;
  return b;
}

}  // namespace kbn
