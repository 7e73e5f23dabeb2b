// A checkpoint's bad tensors are refused at load, named: a dtype that cannot hold the parameter's values (a tensor
// relabelled I32 loaded as garbage numbers before), and NaN or Inf values (they ran and printed garbage tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/model_loader.h"
#include "kbn/safetensors.h"
#include "kbn/weight_loading.h"
#include "test_errors.h"
#include "test_paths.h"
#include "test_process.h"

using namespace kbn;
namespace fs = std::filesystem;

namespace {

// A copy of the tiny Llama checkpoint (one file) with `edit` applied to the tensor named `name`.
fs::path edited_checkpoint(const std::string& name, const std::function<Tensor(const Tensor&)>& edit) {
  const Checkpoint ck = Checkpoint::open(kbn::test::fixture_dir() + "/tiny-llama");
  std::vector<std::pair<std::string, Tensor>> ts;
  bool found = false;
  for (const auto& n : ck.names()) {
    ts.emplace_back(n, n == name ? edit(ck.load(n)) : ck.load(n));
    found = found || n == name;
  }
  EXPECT_TRUE(found) << name;
  const fs::path dir = kbn::test::temp_dir("kbn_weight_checks");
  fs::copy_file(kbn::test::fixture_dir() + "/tiny-llama/config.json", dir / "config.json");
  save_safetensors((dir / "model.safetensors").string(), ts);
  return dir;
}

std::string load_error(const fs::path& dir) {
  return kbn::test::error_of([&] {
    engine::build_model(engine::resolve_model(dir.string()), Variant::baseline, {DType::f32, Device::cpu()}, 0);
  });
}

// The same bytes under another dtype label (F32 -> I32: what a mislabelled conversion writes).
Tensor relabelled(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype);
  EXPECT_EQ(out.nbytes(), t.nbytes());
  std::memcpy(out.data_ptr(), t.data_ptr(), t.nbytes());
  return out;
}

Tensor with_value_at(const Tensor& t, int64_t index, float value) {
  std::vector<float> v = t.to_floats();
  v[size_t(index)] = value;
  return Tensor::from_floats(v, t.shape(), t.dtype());
}

}  // namespace

TEST(WeightChecks, NonFiniteCountByDtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    int64_t first = -2;
    EXPECT_EQ(non_finite_count(Tensor::from_floats({1, -2, 65504, 0}, {4}, dt), &first), 0) << dtype_name(dt);
    EXPECT_EQ(first, -1);
    EXPECT_EQ(non_finite_count(Tensor::from_floats({1, nan, -inf, inf, 3}, {5}, dt), &first), 3) << dtype_name(dt);
    EXPECT_EQ(first, 1);
  }
  EXPECT_EQ(non_finite_count(Tensor::from_i32({-1, 0x7f800000}, {2})), 0);  // integers are never "non-finite"
}

TEST(WeightChecks, RelabelledI32TensorRefusedWithNameAndDtypes) {
  const fs::path dir = edited_checkpoint("model.layers.1.mlp.up_proj.weight",
                                         [](const Tensor& t) { return relabelled(t, DType::i32); });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("checkpoint tensor 'model.layers.1.mlp.up_proj.weight' has dtype I32; expected a "
                     "floating-point dtype"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("(f32)"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(WeightChecks, NanInAWeightRefusedWithItsName) {
  const fs::path dir = edited_checkpoint("model.layers.0.self_attn.o_proj.weight", [](const Tensor& t) {
    return with_value_at(t, 77, std::numeric_limits<float>::quiet_NaN());
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("checkpoint tensor 'model.layers.0.self_attn.o_proj.weight' holds 1 of 4096 values that are "
                     "NaN or Inf (the first at flat index 77)"),
            std::string::npos)
      << err;
  fs::remove_all(dir);
}

TEST(WeightChecks, InfInABf16CheckpointRefused) {
  const fs::path dir = edited_checkpoint("model.norm.weight", [](const Tensor& t) {
    return with_value_at(t, 0, -std::numeric_limits<float>::infinity()).to(DType::bf16);
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("'model.norm.weight' holds 1 of 64 values that are NaN or Inf"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(WeightChecks, GenerateRefusesANanCheckpoint) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const fs::path dir = edited_checkpoint("lm_head.weight", [](const Tensor& t) {
    return with_value_at(t, 5, std::numeric_limits<float>::quiet_NaN());
  });
  const auto r = kbn::test::shell(exe + " generate --device cpu --max-new-tokens 2 --model " + dir.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("'lm_head.weight' holds 1 of"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("prompt 0"), std::string::npos) << r.output;
  fs::remove_all(dir);
}
