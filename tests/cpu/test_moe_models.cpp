// Mixture-of-experts models on CPU (every L1 op is the reference oracle): Mixtral and Qwen3-MoE configs and their
// refusals, vLLM's sparse/dense layer rule, the MoE blocks against a naive per-token computation, per-expert
// checkpoint names stacked into FusedMoE's w13/w2 at TP 1 and TP 2, and the tiny models end to end (greedy
// generation, the serving engine, TP 2 against TP 1 from one checkpoint).
// No transformers fixture exists for these yet: tools/hf_reference.py makes one on the GPU machine
// (tests/fixtures/tiny-mixtral, tests/fixtures/tiny-qwen3-moe), after which a check_against_hf test can join.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "L2/fused_moe.h"
#include "L2/mixtral_moe.h"
#include "L2/qwen3_moe_sparse_moe_block.h"
#include "L3/qwen3_moe_decoder_layer.h"
#include "L4/qwen3_moe.h"
#include "configs/mixtral.h"
#include "configs/qwen3_moe.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/error.h"
#include "kbn/model_view.h"
#include "kbn/module.h"
#include "kbn/op_case.h"
#include "kbn/safetensors.h"
#include "test_errors.h"
#include "test_paths.h"

using namespace kbn;
using kbn::test::error_of;

namespace {

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

// A models/ config with some keys replaced (a null value removes the key's meaning, as in HF).
ModelConfig edited(const std::string& name, const nlohmann::json& changes) {
  nlohmann::json j = nlohmann::json::parse(engine::resolve_model(name).config.dump());
  for (auto it = changes.begin(); it != changes.end(); ++it) j[it.key()] = it.value();
  return ModelConfig::parse(j.dump(), name + " (edited)");
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("kbn_moe_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

const ParamOptions kCpu{DType::f32, Device::cpu()};

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// The MoE MLP computed naively in double from the stacked parameters: router logits, softmax, the top_k experts
// (ties to the lower index), optional renormalization, and each chosen expert's silu-gated MLP.
std::vector<double> naive_moe(const Tensor& x, const Tensor& gate_w, const Tensor& w13, const Tensor& w2, int64_t top_k,
                              bool renormalize) {
  const int64_t T = x.size(0), H = x.size(1), E = gate_w.size(0), N = w2.size(2);
  const auto xs = x.to_doubles(), g = gate_w.to_doubles(), a = w13.to_doubles(), b = w2.to_doubles();
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> logit(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += g[size_t(e * H + h)] * xs[size_t(t * H + h)];
      logit[size_t(e)] = s;
    }
    const double mx = *std::max_element(logit.begin(), logit.end());
    double z = 0;
    std::vector<double> p(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(logit[size_t(e)] - mx));
    for (auto& v : p) v /= z;
    std::vector<int64_t> chosen;
    std::vector<bool> used(static_cast<size_t>(E), false);
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!used[size_t(e)] && (best < 0 || logit[size_t(e)] > logit[size_t(best)])) best = e;
      used[size_t(best)] = true;
      chosen.push_back(best);
    }
    double wsum = 0;
    for (int64_t e : chosen) wsum += p[size_t(e)];
    for (int64_t e : chosen) {
      const double w = renormalize ? p[size_t(e)] / wsum : p[size_t(e)];
      std::vector<double> act(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        double gt = 0, up = 0;
        for (int64_t h = 0; h < H; ++h) {
          gt += a[size_t((e * 2 * N + n) * H + h)] * xs[size_t(t * H + h)];
          up += a[size_t((e * 2 * N + N + n) * H + h)] * xs[size_t(t * H + h)];
        }
        act[size_t(n)] = silu(gt) * up;
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t n = 0; n < N; ++n) y += b[size_t((e * H + h) * N + n)] * act[size_t(n)];
        out[size_t(t * H + h)] += w * y;
      }
    }
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The checkpoint names of a family's experts (HF): Mixtral w1/w3/w2, Qwen3-MoE gate_proj/up_proj/down_proj.
struct ExpertNames {
  std::string gate, up, down;
};
const ExpertNames kMixtralNames{"w1", "w3", "w2"};
const ExpertNames kQwenNames{"gate_proj", "up_proj", "down_proj"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A TP-1 model's parameters written back as an HF checkpoint: fused q/k/v and gate/up split, every expert of the
// stacked w13/w2 as its own tensors, under the family's names. Returns the tensors by checkpoint name.
std::map<std::string, Tensor> export_hf(const Module& model, int64_t q_rows, int64_t kv_rows, const ExpertNames& names,
                                        const std::string& path) {
  std::map<std::string, Tensor> out;
  auto put = [&](const std::string& name, const Tensor& t) { out[name] = t.contiguous().clone(); };
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor& w = *p.tensor;
    if (ends_with(name, ".qkv_proj.weight")) {
      const std::string base = name.substr(0, name.size() - std::string(".qkv_proj.weight").size());
      put(base + ".q_proj.weight", w.slice(0, 0, q_rows));
      put(base + ".k_proj.weight", w.slice(0, q_rows, q_rows + kv_rows));
      put(base + ".v_proj.weight", w.slice(0, q_rows + kv_rows, q_rows + 2 * kv_rows));
    } else if (ends_with(name, ".gate_up_proj.weight")) {
      const std::string base = name.substr(0, name.size() - std::string(".gate_up_proj.weight").size());
      const int64_t half = w.size(0) / 2;
      put(base + ".gate_proj.weight", w.slice(0, 0, half));
      put(base + ".up_proj.weight", w.slice(0, half, 2 * half));
    } else if (ends_with(name, ".experts.w13_weight")) {
      const std::string base = name.substr(0, name.size() - std::string("w13_weight").size());
      const int64_t n = w.size(1) / 2;
      for (int64_t e = 0; e < w.size(0); ++e) {
        put(base + std::to_string(e) + "." + names.gate + ".weight", w.select(0, e).slice(0, 0, n));
        put(base + std::to_string(e) + "." + names.up + ".weight", w.select(0, e).slice(0, n, 2 * n));
      }
    } else if (ends_with(name, ".experts.w2_weight")) {
      const std::string base = name.substr(0, name.size() - std::string("w2_weight").size());
      for (int64_t e = 0; e < w.size(0); ++e)
        put(base + std::to_string(e) + "." + names.down + ".weight", w.select(0, e));
    } else {
      put(name, w);
    }
  }
  std::vector<std::pair<std::string, Tensor>> list(out.begin(), out.end());
  save_safetensors(path, list);
  return out;
}

// A tiny MoE model with seeded random weights written as an HF folder (config.json + model.safetensors).
struct TinyCheckpoint {
  std::string dir;
  std::map<std::string, Tensor> tensors;
};

TinyCheckpoint make_checkpoint(const std::string& model_name, const ExpertNames& names) {
  const engine::ModelSpec spec = engine::resolve_model(model_name);
  auto model = engine::build_model(spec, Variant::baseline, kCpu, 99);
  const ModelView v = ModelView::from(model_name, std::make_shared<const ModelConfig>(spec.config), 1);
  const int64_t q_rows = v.attention->total_num_heads * v.attention->head_dim;
  const int64_t kv_rows = v.attention->total_num_kv_heads * v.attention->head_dim;
  TinyCheckpoint c;
  c.dir = temp_dir(model_name);
  std::ofstream(c.dir + "/config.json") << spec.config.dump();
  c.tensors = export_hf(*model, q_rows, kv_rows, names, c.dir + "/model.safetensors");
  return c;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 6, 7}, {100, 3, 9, 44, 12, 300, 17}, {511}};

engine::GenerateResult generate(CausalLM& model, int64_t new_tokens = 8) {
  engine::GenerateOptions opt;
  opt.max_new_tokens = new_tokens;
  opt.return_prompt_logits = true;
  return engine::generate_tokens(model, kPrompts, Device::cpu(), Variant::baseline, opt);
}

const Tensor& param(const Module& m, const std::string& name) { return *m.parameter(name).tensor; }

}  // namespace

// ---- configs ----

TEST(MoeConfig, PublishedConfigsParse) {
  const MixtralConfig m = MixtralConfig::from(engine::resolve_model("mixtral-8x7b-instruct-v0.1").config);
  EXPECT_EQ(m.num_local_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.intermediate_size, 14336);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.rope_theta, 1e6);

  const ModelConfig qc = engine::resolve_model("qwen3-30b-a3b").config;
  const Qwen3MoeConfig q = Qwen3MoeConfig::from(qc);
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.num_experts_per_tok, 8);
  EXPECT_EQ(q.moe_intermediate_size, 768);
  EXPECT_EQ(q.intermediate_size, 6144);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_TRUE(q.norm_topk_prob);
  int64_t sparse = 0;
  for (int64_t l = 0; l < q.num_hidden_layers; ++l) sparse += q.is_sparse_layer(l);
  EXPECT_EQ(sparse, 48);
  const ModelView v = ModelView::from("qwen3-30b-a3b", std::make_shared<const ModelConfig>(qc), 1);
  ASSERT_TRUE(v.moe);
  EXPECT_EQ(v.moe->num_sparse_layers, sparse);
}

TEST(MoeConfig, MixtralRefusalsNameTheKey) {
  expect_contains(error_of([] { MixtralConfig::from(edited("tiny-mixtral", {{"num_experts_per_tok", 5}})); }),
                  {"num_experts_per_tok", "[1, num_local_experts = 4]", "5"});
  expect_contains(error_of([] { MixtralConfig::from(edited("tiny-mixtral", {{"num_local_experts", 0}})); }),
                  {"num_local_experts", "positive"});
  expect_contains(error_of([] { MixtralConfig::from(edited("tiny-mixtral", {{"num_local_experts", nullptr}})); }),
                  {"num_local_experts"});
  expect_contains(error_of([] { MixtralConfig::from(edited("tiny-mixtral", {{"sliding_window", 4096}})); }),
                  {"sliding_window", "4096"});
  expect_contains(error_of([] { MixtralConfig::from(edited("tiny-mixtral", {{"hidden_act", "gelu"}})); }),
                  {"hidden_act"});
  // Through the registry's model factory too.
  engine::ModelSpec spec = engine::resolve_model("tiny-mixtral");
  spec.config = edited("tiny-mixtral", {{"num_experts_per_tok", 0}});
  expect_contains(error_of([&] { engine::build_model(spec, Variant::baseline, kCpu, 0); }), {"num_experts_per_tok"});
}

TEST(MoeConfig, Qwen3MoeRefusalsNameTheKey) {
  expect_contains(error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"decoder_sparse_step", 0}})); }),
                  {"decoder_sparse_step", "positive"});
  expect_contains(
      error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"mlp_only_layers", std::vector<int>{0, 3}}})); }),
      {"mlp_only_layers", "3", "num_hidden_layers = 3"});
  expect_contains(error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"num_experts_per_tok", 9}})); }),
                  {"num_experts_per_tok", "[1, num_experts = 8]"});
  expect_contains(error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"moe_intermediate_size", 0}})); }),
                  {"moe_intermediate_size"});
  expect_contains(error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"num_experts", -1}})); }),
                  {"num_experts"});
  expect_contains(error_of([] { Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"use_sliding_window", true}})); }),
                  {"use_sliding_window"});
  engine::ModelSpec spec = engine::resolve_model("tiny-qwen3-moe");
  spec.config = edited("tiny-qwen3-moe", {{"decoder_sparse_step", -2}});
  expect_contains(error_of([&] { engine::build_model(spec, Variant::baseline, kCpu, 0); }), {"decoder_sparse_step"});
}

// ---- vLLM's sparse/dense layer rule ----

TEST(Qwen3MoeLayers, SparseIffNotMlpOnlyAndExpertsAndStepDividesIndexPlusOne) {
  struct Case {
    nlohmann::json changes;
    std::vector<bool> sparse;
  };
  const std::vector<Case> cases = {
      {{{"decoder_sparse_step", 1}, {"mlp_only_layers", std::vector<int>{1}}}, {true, false, true}},
      {{{"decoder_sparse_step", 2}, {"mlp_only_layers", std::vector<int>{}}}, {false, true, false}},
      {{{"decoder_sparse_step", 1}, {"mlp_only_layers", std::vector<int>{}}}, {true, true, true}},
      {{{"decoder_sparse_step", 3}, {"mlp_only_layers", std::vector<int>{2}}}, {false, false, false}},
      {{{"decoder_sparse_step", 1}, {"num_experts", 0}}, {false, false, false}},
      {{{"decoder_sparse_step", nullptr}, {"mlp_only_layers", nullptr}}, {true, true, true}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.changes.dump());
    const ModelConfig mc = edited("tiny-qwen3-moe", c.changes);
    const Qwen3MoeConfig q = Qwen3MoeConfig::from(mc);
    std::vector<bool> got;
    for (int64_t l = 0; l < q.num_hidden_layers; ++l) got.push_back(q.is_sparse_layer(l));
    EXPECT_EQ(got, c.sparse);
    // The built model follows the rule layer by layer, and the model view counts the same sparse layers.
    engine::ModelSpec spec = engine::resolve_model("tiny-qwen3-moe");
    spec.config = mc;
    auto model = engine::build_model(spec, Variant::baseline, kCpu, 1);
    auto* m = dynamic_cast<baseline::Qwen3MoeForCausalLM*>(model.get());
    ASSERT_NE(m, nullptr);
    int64_t count = 0;
    for (size_t l = 0; l < c.sparse.size(); ++l) {
      const auto& layer = *m->model.layers[l];
      EXPECT_EQ(layer.layer_idx(), int64_t(l));
      EXPECT_EQ(layer.is_sparse(), c.sparse[l]) << "layer " << l;
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      if (c.sparse[l]) {
        EXPECT_EQ(param(*model, p + "experts.w13_weight").shape(), (Shape{8, 96, 64}));
        EXPECT_EQ(param(*model, p + "experts.w2_weight").shape(), (Shape{8, 64, 48}));
        EXPECT_EQ(param(*model, p + "gate.weight").shape(), (Shape{8, 64}));
        EXPECT_THROW(model->parameter(p + "gate_up_proj.weight"), Error);
      } else {
        EXPECT_EQ(param(*model, p + "gate_up_proj.weight").shape(), (Shape{320, 64}));
        EXPECT_EQ(param(*model, p + "down_proj.weight").shape(), (Shape{64, 160}));
        EXPECT_THROW(model->parameter(p + "experts.w13_weight"), Error);
      }
      count += c.sparse[l];
    }
    const ModelView v = ModelView::from("edited", std::make_shared<const ModelConfig>(mc), 1);
    EXPECT_EQ(v.moe ? v.moe->num_sparse_layers : 0, count);
  }
}

TEST(Qwen3MoeLayers, PrefixMustEndInTheLayerIndex) {
  const Qwen3MoeConfig q = Qwen3MoeConfig::from(engine::resolve_model("tiny-qwen3-moe").config);
  expect_contains(error_of([&] { baseline::Qwen3MoeDecoderLayer(q, "model.layers.x", kCpu); }),
                  {"model.layers.x", "layer index"});
  expect_contains(error_of([&] { baseline::Qwen3MoeDecoderLayer(q, "model.layers.7", kCpu); }),
                  {"layer_idx 7", "num_hidden_layers = 3"});
}

// ---- the MoE blocks against a naive computation ----

TEST(MoeBlocks, MixtralMoeMatchesNaiveRoutingAndExperts) {
  baseline::MixtralMoE moe(4, 2, 16, 24, "moe", kCpu);
  init_random_weights(moe, 3, 0.3);
  const Tensor x = cases::normal({7, 16}, DType::f32, Device::cpu(), 4, "x", 1.0);
  const std::vector<float> got = moe.forward(x).to_floats();
  const std::vector<double> want =
      naive_moe(x, moe.gate.weight, moe.experts.w13_weight, moe.experts.w2_weight, 2, true);
  EXPECT_GT(max_abs(want), 1e-2);
  EXPECT_LT(max_abs_diff(got, want), 1e-5 * std::max(1.0, max_abs(want)));
}

TEST(MoeBlocks, Qwen3MoeSparseBlockRenormalizesOnlyWithNormTopkProb) {
  std::vector<std::vector<float>> outs;
  for (bool norm : {false, true}) {
    SCOPED_TRACE(norm);
    const Qwen3MoeConfig q = Qwen3MoeConfig::from(edited("tiny-qwen3-moe", {{"norm_topk_prob", norm}}));
    baseline::Qwen3MoeSparseMoeBlock block(q, "model.layers.0.mlp", kCpu);
    init_random_weights(block, 5, 0.3);
    const Tensor x = cases::normal({6, 64}, DType::f32, Device::cpu(), 6, "x", 1.0);
    outs.push_back(block.forward(x).to_floats());
    const std::vector<double> want =
        naive_moe(x, block.gate.weight, block.experts.w13_weight, block.experts.w2_weight, 2, norm);
    EXPECT_GT(max_abs(want), 1e-2);
    EXPECT_LT(max_abs_diff(outs.back(), want), 1e-5 * std::max(1.0, max_abs(want)));
  }
  EXPECT_NE(outs[0], outs[1]);
}

TEST(MoeBlocks, FusedMoeChecksItsInputs) {
  baseline::FusedMoE moe(4, 2, 16, 24, true, true, "experts", kCpu);
  const Tensor x = Tensor::zeros({3, 16}, DType::f32);
  expect_contains(error_of([&] { moe.forward(x, Tensor::zeros({3, 5}, DType::f32)); }),
                  {"FusedMoE", "router_logits", "num_experts"});
  expect_contains(error_of([&] { moe.forward(x, Tensor::zeros({2, 4}, DType::f32)); }), {"FusedMoE", "router_logits"});
  expect_contains(error_of([&] { moe.forward(Tensor::zeros({3, 8}, DType::f32), Tensor::zeros({3, 4}, DType::f32)); }),
                  {"FusedMoE", "hidden_states", "hidden_size"});
  expect_contains(error_of([] { baseline::FusedMoE(4, 5, 16, 24, true, true, "bad", kCpu); }), {"top_k", "5"});
}

// ---- per-expert checkpoint names into the stacked parameters ----

namespace {

// Every expert's gate/up rows and down columns of this rank's shard equal the checkpoint tensors' shard.
void check_experts_loaded(const Module& model, const std::map<std::string, Tensor>& ckpt, const std::string& moe,
                          const ExpertNames& names, int rank, int tp) {
  const Tensor& w13 = param(model, moe + ".experts.w13_weight");
  const Tensor& w2 = param(model, moe + ".experts.w2_weight");
  const int64_t n = w13.size(1) / 2;
  for (int64_t e = 0; e < w13.size(0); ++e) {
    const std::string x = moe + ".experts." + std::to_string(e) + ".";
    const Tensor& g = ckpt.at(x + names.gate + ".weight");
    const Tensor& u = ckpt.at(x + names.up + ".weight");
    const Tensor& d = ckpt.at(x + names.down + ".weight");
    ASSERT_EQ(g.size(0), n * tp);
    EXPECT_EQ(w13.select(0, e).slice(0, 0, n).to_floats(), g.slice(0, rank * n, (rank + 1) * n).to_floats()) << x;
    EXPECT_EQ(w13.select(0, e).slice(0, n, 2 * n).to_floats(), u.slice(0, rank * n, (rank + 1) * n).to_floats()) << x;
    EXPECT_EQ(w2.select(0, e).to_floats(), d.slice(1, rank * n, (rank + 1) * n).to_floats()) << x;
  }
}

void check_checkpoint_at_tp(const std::string& model_name, const ExpertNames& names,
                            const std::vector<std::string>& moe_prefixes) {
  const TinyCheckpoint ck = make_checkpoint(model_name, names);
  const engine::ModelSpec spec = engine::resolve_model(ck.dir);
  ASSERT_FALSE(spec.weights_path.empty());
  // Experts of different indices must differ, or a swapped expert would go unseen.
  EXPECT_NE(ck.tensors.at(moe_prefixes[0] + ".experts.0." + names.gate + ".weight").to_floats(),
            ck.tensors.at(moe_prefixes[0] + ".experts.1." + names.gate + ".weight").to_floats());

  auto one = engine::build_model(spec, Variant::baseline, kCpu, 0);
  for (const auto& p : moe_prefixes) check_experts_loaded(*one, ck.tensors, p, names, 0, 1);
  const engine::GenerateResult r1 = generate(*one);

  engine::TensorParallelGroup group(2, Device::cpu());
  std::vector<engine::GenerateResult> r2(2);
  group.run([&](int rank) {
    auto shard = engine::build_model(spec, Variant::baseline, kCpu, 0);
    for (const auto& p : moe_prefixes) check_experts_loaded(*shard, ck.tensors, p, names, rank, 2);
    r2[size_t(rank)] = generate(*shard);
  });
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(r2[0].tokens[i], r1.tokens[i]) << "prompt " << i;
    EXPECT_EQ(r2[1].tokens[i], r1.tokens[i]) << "prompt " << i;
    const std::vector<float> a = r1.prompt_logits[i].to_floats(), b = r2[0].prompt_logits[i].to_floats();
    ASSERT_EQ(a.size(), b.size());
    double err = 0, mag = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      err = std::max(err, double(std::fabs(a[j] - b[j])));
      mag = std::max(mag, double(std::fabs(a[j])));
    }
    EXPECT_GT(mag, 1e-3) << "prompt " << i;
    EXPECT_LT(err, 2e-5) << "prompt " << i;
    EXPECT_EQ(r2[1].prompt_logits[i].to_floats(), b) << "rank 1 prompt " << i;
  }
  std::filesystem::remove_all(ck.dir);
}

}  // namespace

TEST(MoeCheckpoint, MixtralPerExpertNamesStackAndTp2EqualsTp1) {
  check_checkpoint_at_tp("tiny-mixtral", kMixtralNames,
                         {"model.layers.0.block_sparse_moe", "model.layers.1.block_sparse_moe"});
}

TEST(MoeCheckpoint, Qwen3MoePerExpertNamesStackAndTp2EqualsTp1) {
  check_checkpoint_at_tp("tiny-qwen3-moe", kQwenNames, {"model.layers.0.mlp", "model.layers.2.mlp"});
}

TEST(MoeCheckpoint, MissingExpertAndFusedNamesAreNamed) {
  const TinyCheckpoint ck = make_checkpoint("tiny-mixtral", kMixtralNames);
  // One expert's w3 missing: the stacked parameter is named with how many of its parts arrived.
  {
    std::vector<std::pair<std::string, Tensor>> list;
    for (const auto& [n, t] : ck.tensors)
      if (n != "model.layers.1.block_sparse_moe.experts.2.w3.weight") list.push_back({n, t});
    save_safetensors(ck.dir + "/model.safetensors", list);
    const engine::ModelSpec spec = engine::resolve_model(ck.dir);
    expect_contains(error_of([&] { engine::build_model(spec, Variant::baseline, kCpu, 0); }),
                    {"model.layers.1.block_sparse_moe.experts.w13_weight", "7 of 8"});
  }
  // A fused expert layout (not read): the tensor is named as matching no parameter.
  {
    std::vector<std::pair<std::string, Tensor>> list(ck.tensors.begin(), ck.tensors.end());
    list.push_back({"model.layers.0.block_sparse_moe.experts.gate_up_proj", Tensor::zeros({4, 64, 192}, DType::f32)});
    save_safetensors(ck.dir + "/model.safetensors", list);
    const engine::ModelSpec spec = engine::resolve_model(ck.dir);
    expect_contains(error_of([&] { engine::build_model(spec, Variant::baseline, kCpu, 0); }),
                    {"experts.gate_up_proj", "matches no parameter"});
  }
  // A wrongly shaped expert: the loader's message names the checkpoint tensor and the expected shape.
  {
    std::vector<std::pair<std::string, Tensor>> list;
    for (const auto& [n, t] : ck.tensors)
      list.push_back({n, n == "model.layers.0.block_sparse_moe.experts.3.w2.weight"
                             ? Tensor::zeros({64, 48}, DType::f32)
                             : t});
    save_safetensors(ck.dir + "/model.safetensors", list);
    const engine::ModelSpec spec = engine::resolve_model(ck.dir);
    expect_contains(error_of([&] { engine::build_model(spec, Variant::baseline, kCpu, 0); }),
                    {"model.layers.0.block_sparse_moe.experts.3.w2.weight", "expert 3", "[64, 96]"});
  }
  std::filesystem::remove_all(ck.dir);
}

// ---- end to end ----

namespace {

void check_end_to_end(const std::string& name) {
  const engine::ModelSpec spec = engine::resolve_model(name);
  auto a = engine::build_model(spec, Variant::baseline, kCpu, 11);
  auto b = engine::build_model(spec, Variant::baseline, kCpu, 11);
  const engine::GenerateResult ra = generate(*a, 12), rb = generate(*b, 12);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_EQ(ra.tokens[i].size(), 12u);
    for (int64_t t : ra.tokens[i]) EXPECT_TRUE(t >= 0 && t < 512) << t;
    EXPECT_EQ(ra.tokens[i], rb.tokens[i]) << "prompt " << i;
    const std::vector<float> la = ra.prompt_logits[i].to_floats();
    EXPECT_EQ(la, rb.prompt_logits[i].to_floats()) << "prompt " << i;
    for (float v : la) ASSERT_TRUE(std::isfinite(v));
  }
  // Another seed is another model: the weights reach the logits.
  auto c = engine::build_model(spec, Variant::baseline, kCpu, 12);
  EXPECT_NE(generate(*c, 1).prompt_logits[0].to_floats(), ra.prompt_logits[0].to_floats());

  // The serving engine (continuous batching, chunked prefill of 5 tokens, a small KV pool) gives the greedy tokens.
  std::vector<engine::Request> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    engine::Request r;
    r.id = int64_t(i);
    r.prompt = kPrompts[i];
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  engine::EngineConfig cfg;
  cfg.max_model_len = 64;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 24;
  cfg.max_num_batched_tokens = 5;
  engine::LLMEngine eng(*a, Variant::baseline, Device::cpu(), cfg);
  const engine::RunResult run = eng.run_to_completion(reqs);
  ASSERT_EQ(run.outputs.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(run.outputs[i].tokens, ra.tokens[i]) << "prompt " << i;
}

}  // namespace

TEST(MoeEndToEnd, TinyMixtralGreedyAndEngineAreDeterministic) { check_end_to_end("tiny-mixtral"); }

TEST(MoeEndToEnd, TinyQwen3MoeGreedyAndEngineAreDeterministic) { check_end_to_end("tiny-qwen3-moe"); }
