#pragma once
// What each layer of a model keeps between steps, declared by the model (CausalLM::cache_specs(), one entry per
// layer, indexed like the layers' prefixes). The engine allocates and sizes its caches from these declarations
// with no branch on the model: a family whose layers need something new declares a new kind, and the engine
// gains a cache manager for that kind, not an `if` for that family.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kbn/dtype.h"
#include "kbn/tensor.h"

namespace kbn {

struct LayerCacheSpec {
  enum class Kind {
    paged_kv,      // K and V pages, [num_blocks, block_size, num_kv_heads, head_size] each (attention layers)
    paged_latent,  // one latent row per token, [num_blocks, block_size, latent_size] (MLA)
    state,         // fixed-size state per sequence, of state_shapes (Mamba, gated delta net)
  };
  Kind kind = Kind::paged_kv;
  DType dtype = DType::f32;
  int64_t num_kv_heads = 0, head_size = 0;  // paged_kv
  int64_t sliding_window = 0;               // paged_kv: keys this far back or more are never read (0: all)
  int64_t latent_size = 0;                  // paged_latent
  std::vector<Shape> state_shapes;          // state

  static LayerCacheSpec paged_kv(int64_t num_kv_heads, int64_t head_size, DType dtype, int64_t sliding_window = 0);
  static LayerCacheSpec paged_latent(int64_t latent_size, DType dtype);
  // Bytes one token's slot costs in this layer (paged kinds; 0 for state).
  int64_t bytes_per_token() const;
  // Bytes one sequence's state costs in this layer (state kind; 0 for the paged kinds).
  int64_t bytes_per_sequence() const;
  // "paged K/V 8 x 128 bf16", "paged K/V 8 x 128 bf16, window 128", "latent 576 bf16", "state [4, 8192] ..."
  std::string describe() const;
};

const char* cache_kind_name(LayerCacheSpec::Kind kind);

// KV cache groups (vLLM's hybrid KV cache manager): the paged layers of a model, grouped so that each group's layers
// follow one block table. With one sliding window among them (0, none, included) every paged layer is in group 0 and
// has a pool tensor of its own, as in a plain paged cache. With several (gpt-oss: 128-key sliding layers between full
// ones; Gemma-3: five 1024-key local layers per global one), the layers of each window are cut, in layer order, into
// groups of G layers (G: the fewest layers any window has; a last group may be smaller), and the j-th layer of every
// group shares pool tensor j: a block is one block_size-token page of each of the G tensors, and a block id means the
// same memory whichever group's table holds it. A sliding group's table then holds only the blocks its window reaches
// (engine::BlockManager), so the memory a long sequence costs on sliding layers is window-sized. Groups are ordered by
// window, full attention (0) first. Several groups need every paged layer to have the same page (kind, heads, head
// size, latent size, dtype); the error names the first two layers that differ. A model without paged layers has one
// group of no layers.
struct KVCacheGroups {
  std::vector<int64_t> windows;       // per group: its layers' sliding window (0: full attention)
  std::vector<int32_t> layer_group;   // per layer: its group, -1 for a layer without pages (recurrent state)
  std::vector<int32_t> layer_tensor;  // per layer: the pool tensor it reads and writes, -1 without pages
  int64_t num_tensors = 0;            // pool tensors (K/V pairs or latent tensors)
  int64_t num_groups() const { return int64_t(windows.size()); }
};
KVCacheGroups kv_cache_groups(const std::vector<LayerCacheSpec>& specs);

// vLLM's kv_cache_dtype: "auto" (the pages keep the model's dtype: nullopt), "fp8" or "fp8_e4m3" (fp8 e4m3 pages
// with per-tensor scales, KVScales below). Anything else, fp8_e5m2 included
// (no kernel reads e5m2 pages), is an error naming `what` (the flag or field) and the accepted values.
std::optional<DType> parse_kv_cache_dtype(const std::string& value, const std::string& what = "kv_cache_dtype");
// The per-tensor scales of fp8 K/V pages (vLLM's k_scale / v_scale, which quantized checkpoints carry per attention
// layer): a page element e stands for e * k (keys) or e * v (values), so a store writes x / scale (rounded once to
// e4m3) and attention reads e * scale. 1.0 is vLLM's default for a checkpoint without them; pages of a 16-bit or f32
// dtype are stored unscaled and take only 1.0.
struct KVScales {
  float k = 1.f, v = 1.f;
};
// Checks `scales` for an op whose pages have dtype `pages`: each finite and positive, and 1.0 unless the pages are
// fp8 e4m3. The error names `op` and the scale (k_scale / v_scale).
void check_kv_scales(const char* op, const KVScales& scales, DType pages);

// `specs` with the paged K/V layers' pages in `dtype` (nullopt: unchanged). A paged latent layer (MLA) has no fp8
// path: the error names the layer.
std::vector<LayerCacheSpec> with_kv_cache_dtype(std::vector<LayerCacheSpec> specs, std::optional<DType> dtype);

// The bytes one pool block of `block_size` tokens costs: a page of every pool tensor (kv_cache_groups).
int64_t paged_bytes_per_block(const std::vector<LayerCacheSpec>& specs, int64_t block_size);

}  // namespace kbn
