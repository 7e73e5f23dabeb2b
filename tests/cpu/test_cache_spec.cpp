// Per-layer cache declarations (kbn/cache_spec.h): what each kind costs, how the engine allocates from them, and
// the refusal of a kind it has no cache manager for yet, naming the layer.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/model_loader.h"
#include "kbn/cache_spec.h"
#include "kbn/error.h"

using namespace kbn;

TEST(CacheSpec, BytesPerTokenBlockAndSequence) {
  const LayerCacheSpec kv = LayerCacheSpec::paged_kv(8, 128, DType::bf16);
  EXPECT_EQ(kv.bytes_per_token(), 2 * 8 * 128 * 2);
  EXPECT_EQ(kv.bytes_per_sequence(), 0);
  LayerCacheSpec latent;
  latent.kind = LayerCacheSpec::Kind::paged_latent;
  latent.dtype = DType::bf16;
  latent.latent_size = 576;
  EXPECT_EQ(latent.bytes_per_token(), 576 * 2);
  LayerCacheSpec state;
  state.kind = LayerCacheSpec::Kind::state;
  state.dtype = DType::f32;
  state.state_shapes = {{3, 8192}, {128, 64, 128}};
  EXPECT_EQ(state.bytes_per_token(), 0);
  EXPECT_EQ(state.bytes_per_sequence(), (3 * 8192 + 128 * 64 * 128) * 4);
  // A hybrid: paged layers cost per block, the state layer not at all.
  EXPECT_EQ(paged_bytes_per_block({kv, latent, state}, 16), 16 * (2 * 8 * 128 * 2 + 576 * 2));
  EXPECT_EQ(LayerCacheSpec::paged_kv(8, 128, DType::bf16, 128).describe(), "paged K/V 8 x 128 bf16, window 128");
  EXPECT_THROW(LayerCacheSpec::paged_kv(0, 128, DType::bf16), Error);
  EXPECT_THROW(LayerCacheSpec::paged_kv(8, 128, DType::bf16, -1), Error);
}

TEST(CacheSpec, TheModelDeclaresOneSpecPerLayerAndTheEngineAllocatesThem) {
  engine::ModelSpec spec = engine::resolve_model("tiny-qwen3");
  auto model = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  const auto specs = model->cache_specs();
  ASSERT_EQ(specs.size(), 2u);  // num_hidden_layers
  EXPECT_EQ(specs[1].describe(), "paged K/V 2 x 32 f32");
  const auto caches = engine::allocate_kv_caches(specs, 3, 16, Device::cpu());
  ASSERT_EQ(caches.size(), 2u);
  EXPECT_EQ(caches[0].key.shape(), (Shape{3, 16, 2, 32}));
}

TEST(CacheSpec, EveryKindGetsItsCache) {
  std::vector<LayerCacheSpec> specs = {LayerCacheSpec::paged_kv(2, 16, DType::f32),
                                       LayerCacheSpec::paged_kv(2, 16, DType::f32)};
  const auto caches = engine::allocate_kv_caches(specs, 4, 16, Device::cpu());
  EXPECT_EQ(caches[1].key.shape(), (Shape{4, 16, 2, 16}));
  LayerCacheSpec state;
  state.kind = LayerCacheSpec::Kind::state;
  state.dtype = DType::f32;
  state.state_shapes = {{3, 8}, {2, 4, 5}};
  specs.push_back(state);
  specs.push_back(LayerCacheSpec::paged_latent(576, DType::f32));
  const auto all = engine::allocate_kv_caches(specs, 4, 16, Device::cpu(), 7);
  ASSERT_EQ(all[2].states.size(), 2u);
  EXPECT_EQ(all[2].states[0].shape(), (Shape{7, 3, 8}));
  EXPECT_EQ(all[2].states[1].shape(), (Shape{7, 2, 4, 5}));
  EXPECT_FALSE(all[2].key.defined());
  EXPECT_EQ(all[3].latent.shape(), (Shape{4, 16, 576}));  // the latent rows share the K/V layers' blocks
  EXPECT_FALSE(all[3].key.defined());
  EXPECT_FALSE(all[3].value.defined());
  // A state layer needs slots.
  try {
    engine::allocate_kv_caches(specs, 4, 16, Device::cpu(), 0);
    FAIL() << "a state layer was allocated without slots";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 2"), std::string::npos) << m;
  }
}

// A config that asks for a sliding window or logit soft-capping that the architecture's model does not apply is
// refused, naming the key: building it would serve full attention in silence.
TEST(CacheSpec, AModelRefusesAttentionFeaturesItDoesNotApply) {
  engine::ModelSpec spec = engine::resolve_model("tiny-qwen3");
  nlohmann::json j = nlohmann::json::parse(spec.config.dump());
  j["sliding_window"] = 64;
  j["use_sliding_window"] = true;
  spec.config = ModelConfig::parse(j.dump(), "windowed tiny-qwen3");
  try {
    engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
    FAIL() << "a windowed config was built as a full-attention model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'sliding_window' is 64"), std::string::npos) << e.what();
  }
  j["use_sliding_window"] = false;  // Qwen's published configs: a window value, switched off
  spec.config = ModelConfig::parse(j.dump(), "tiny-qwen3, window off");
  EXPECT_NO_THROW(engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0));
  j["attn_logit_softcapping"] = 50.0;
  spec.config = ModelConfig::parse(j.dump(), "soft-capped tiny-qwen3");
  EXPECT_THROW(engine::build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0), Error);
}

// KV cache groups (vLLM's hybrid KV cache manager): layers of different windows follow tables of their own over one
// pool whose tensors they share, G layers per group (G: the fewest layers of any window), so that a block costs a
// page of G layers and a sliding group's blocks can go back to the pool while the full layers keep theirs.
TEST(CacheSpec, LayersOfDifferentWindowsShareThePoolInGroups) {
  const auto kv = [](int64_t window) { return LayerCacheSpec::paged_kv(2, 16, DType::f32, window); };
  // gpt-oss: sliding and full layers alternate. Two groups of two layers, two pool tensors.
  const std::vector<LayerCacheSpec> gpt_oss = {kv(128), kv(0), kv(128), kv(0)};
  const KVCacheGroups g = kv_cache_groups(gpt_oss);
  EXPECT_EQ(g.windows, (std::vector<int64_t>{0, 128}));  // full attention first
  EXPECT_EQ(g.layer_group, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_EQ(g.layer_tensor, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(g.num_tensors, 2);
  EXPECT_EQ(paged_bytes_per_block(gpt_oss, 16), 2 * kv(0).bytes_per_token() * 16);  // half of the four layers'
  const auto caches = engine::allocate_kv_caches(gpt_oss, 5, 16, Device::cpu());
  ASSERT_EQ(caches.size(), 4u);
  EXPECT_EQ(caches[0].key.data_ptr(), caches[1].key.data_ptr());  // layer 0 (group 1) and 1 (group 0): tensor 0
  EXPECT_EQ(caches[2].value.data_ptr(), caches[3].value.data_ptr());
  EXPECT_NE(caches[0].key.data_ptr(), caches[2].key.data_ptr());
  EXPECT_EQ(caches[0].kv_group, 1);
  EXPECT_EQ(caches[0].sliding_window, 128);
  EXPECT_EQ(caches[3].kv_group, 0);

  // Gemma-3: five local layers per global one. 12 layers: 2 global, so groups of 2 layers: one full group and five
  // sliding ones.
  std::vector<LayerCacheSpec> gemma;
  for (int l = 0; l < 12; ++l) gemma.push_back(kv(l % 6 == 5 ? 0 : 1024));
  const KVCacheGroups h = kv_cache_groups(gemma);
  EXPECT_EQ(h.windows, (std::vector<int64_t>{0, 1024, 1024, 1024, 1024, 1024}));
  EXPECT_EQ(h.num_tensors, 2);
  EXPECT_EQ(h.layer_group[5], 0);
  EXPECT_EQ(h.layer_group[11], 0);
  EXPECT_EQ(h.layer_group[0], 1);
  EXPECT_EQ(h.layer_group[1], 1);
  EXPECT_EQ(h.layer_group[2], 2);
  EXPECT_EQ(h.layer_tensor[2], 0);
  EXPECT_EQ(h.layer_tensor[3], 1);
  // Windows whose layer counts do not divide: the last group of a window is smaller.
  const KVCacheGroups u = kv_cache_groups({kv(8), kv(8), kv(8), kv(0), kv(0)});
  EXPECT_EQ(u.windows, (std::vector<int64_t>{0, 8, 8}));
  EXPECT_EQ(u.layer_tensor, (std::vector<int32_t>{0, 1, 0, 0, 1}));
  // One window for every layer (none, or all sliding): one group, a tensor per layer, as a plain paged cache.
  const KVCacheGroups one = kv_cache_groups({kv(64), kv(64), kv(64)});
  EXPECT_EQ(one.windows, (std::vector<int64_t>{64}));
  EXPECT_EQ(one.num_tensors, 3);
  // No paged layers (a recurrent model): one group of none.
  LayerCacheSpec state;
  state.kind = LayerCacheSpec::Kind::state;
  state.dtype = DType::f32;
  state.state_shapes = {{3, 8}};
  const KVCacheGroups none = kv_cache_groups({state, state});
  EXPECT_EQ(none.windows, (std::vector<int64_t>{0}));
  EXPECT_EQ(none.layer_group, (std::vector<int32_t>{-1, -1}));
  // Layers of different windows must have the same page to share tensors; the error names both layers.
  try {
    kv_cache_groups({kv(0), LayerCacheSpec::paged_kv(4, 16, DType::f32, 8)});
    FAIL() << "layers with different pages were grouped";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 0 has paged K/V 2 x 16 f32, layer 1 paged K/V 4 x 16 f32, window 8"), std::string::npos)
        << m;
  }
}
