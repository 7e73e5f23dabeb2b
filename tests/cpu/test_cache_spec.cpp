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
  // A windowed layer is allocated like a full one (its blocks are not yet returned; its kernels never read them).
  std::vector<LayerCacheSpec> specs = {LayerCacheSpec::paged_kv(2, 16, DType::f32),
                                       LayerCacheSpec::paged_kv(2, 16, DType::f32, 64)};
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
