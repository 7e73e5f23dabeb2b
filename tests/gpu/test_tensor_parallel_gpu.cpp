// Tensor parallelism over NCCL (needs 2+ GPUs; skipped otherwise): the collectives on bf16/f32 tensors, and the
// sharded tiny Llama on two GPUs against the same checkpoint on one.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generate.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/comm.h"
#include "kbn/parallel_state.h"
#include "test_paths.h"

using namespace kbn;

#define KBN_SKIP_WITHOUT_TWO_GPUS() \
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible"

TEST(NcclGroup, AllReduceAndAllGather) {
  KBN_SKIP_WITHOUT_TWO_GPUS();
  engine::TensorParallelGroup group(2, Device::cuda(0));
  for (const DType dt : {DType::f32, DType::bf16}) {
    std::vector<std::vector<float>> reduced(2), gathered(2);
    group.run([&](int rank) {
      Tensor x = Tensor::full({3, 1000}, 1.0 + rank, dt, Device::cuda(rank));
      parallel_state().comm->all_reduce_sum(x);
      reduced[size_t(rank)] = x.to(Device::cpu()).to_floats();
      Tensor y = Tensor::full({2, 7}, double(rank), dt, Device::cuda(rank));
      Tensor g = parallel_state().comm->all_gather(y);
      EXPECT_EQ(g.shape(), (Shape{2, 2, 7}));
      EXPECT_EQ(g.device(), Device::cuda(rank));
      gathered[size_t(rank)] = g.to(Device::cpu()).to_floats();
      synchronize(Device::cuda(rank));
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(reduced[size_t(r)][2999], 3.0f) << dtype_name(dt);
      EXPECT_EQ(gathered[size_t(r)][0], 0.0f) << dtype_name(dt);
      EXPECT_EQ(gathered[size_t(r)][20], 1.0f) << dtype_name(dt);
    }
  }
}

TEST(NcclGroup, ShardedTinyLlamaMatchesOneGpu) {
  KBN_SKIP_WITHOUT_TWO_GPUS();
  const engine::ModelSpec spec = engine::resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  const std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, {100, 3, 9, 44, 12, 8, 1}};
  engine::GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.return_prompt_logits = true;
  auto single = engine::build_model(spec, Variant::baseline, {DType::f32, Device::cuda(0)}, 0);
  const engine::GenerateResult one =
      engine::greedy_generate(*single, prompts, Device::cuda(0), Variant::baseline, opt);

  engine::TensorParallelGroup group(2, Device::cuda(0));
  std::vector<engine::GenerateResult> tp(2);
  group.run([&](int rank) {
    auto model = engine::build_model(spec, Variant::baseline, {DType::f32, group.device_of(rank)}, 0);
    tp[size_t(rank)] = engine::greedy_generate(*model, prompts, group.device_of(rank), Variant::baseline, opt);
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tp[0].tokens[i], one.tokens[i]) << "prompt " << i;
    EXPECT_EQ(tp[1].tokens[i], one.tokens[i]) << "prompt " << i;
    const std::vector<float> a = tp[0].prompt_logits[i].to_floats(), b = one.prompt_logits[i].to_floats();
    ASSERT_EQ(a.size(), b.size());
    double max_err = 0;
    for (size_t k = 0; k < a.size(); ++k) max_err = std::max(max_err, double(std::fabs(a[k] - b[k])));
    EXPECT_LT(max_err, 1e-4) << "prompt " << i;
  }
}
