#pragma once
// What each layer of a model keeps between steps, declared by the model (CausalLM::cache_specs(), one entry per
// layer, indexed like the layers' prefixes). The engine allocates and sizes its caches from these declarations
// with no branch on the model: a family whose layers need something new declares a new kind, and the engine
// gains a cache manager for that kind, not an `if` for that family.
#include <cstdint>
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

// The number of layers holding K/V pages and the bytes a block of `block_size` tokens costs over all layers.
int64_t paged_bytes_per_block(const std::vector<LayerCacheSpec>& specs, int64_t block_size);

}  // namespace kbn
