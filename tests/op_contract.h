#pragma once
// One parameterised test for every registered op (ggml's test-backend-ops): each (model, op) pair a model's L4
// reaches runs its own test facts (OpEntry::cases) through the validation contract, baseline against a second
// instance of itself and the oracle, on the CPU (tests/cpu/test_ops.cpp, CI) or the GPU
// (tests/gpu/test_ops_gpu.cpp, label gpu). A new op or model is covered by adding its files; nothing here names
// an op. Hand-written tests keep only the edge cases these do not reach.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/validate.h"
#include "engine/model_loader.h"
#include "kbn/registry.h"

namespace kbn::test {

struct OpCase {
  std::string model, op;
};
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.model << " " << c.op; }

// The view the contract runs a model at: bench::model_view's (the features its L4 declares; none for a config whose
// architecture no registered L4 serves yet; the text model's `text_config` where the checkpoint nests it, as
// Gemma-3's does).
inline ModelView contract_view(const engine::ModelSpec& spec) { return bench::model_view(spec.name, spec.config, 1); }

// L1 ops at the real shapes of configs the tiny models stand in for: gpt-oss-20b's standalone swiglu_oai_and_mul (its
// L4 fuses the activation into fused_experts, so no model reaches the op) and YaRN rope, and the published
// Gemma-3-12B's (Gemma3ForConditionalGeneration;
// tiny-gemma3 reaches the same ops at tiny shapes); rotary_embedding is listed for the YaRN, linear and local-base
// ropes these configs give it. DeepSeek-V3's router (grouped, sigmoid, biased), whose architecture no L4 serves
// (DeepseekV2ForCausalLM serves V2 and V2-Lite). V3's 128-head latent decode is not listed: on the CPU its 300-sequence
// case costs minutes of oracle time and checks the oracle against itself; tests/gpu/test_deepseek_gpu.cpp runs
// mla_decode at 128 heads against the oracle on the GPU.
inline std::vector<OpCase> pending_model_op_cases() {
  return {{"gpt-oss-20b", "swiglu_oai_and_mul"}, {"gpt-oss-20b", "rotary_embedding"},
          {"gemma-3-12b-it", "gemma_rms_norm"},  {"gemma-3-12b-it", "gemma_fused_add_rms_norm"},
          {"gemma-3-12b-it", "gelu_and_mul"},    {"gemma-3-12b-it", "rotary_embedding"},
          {"deepseek-v3", "grouped_topk"}};
}

// Every (model, op) with cases, for the given models, levels 1..3. An op whose header the model's L4 reaches but whose
// facts give that model no case is left out: a header declaring several ops, of which the model runs some
// (DeepSeek's MLA uses ColumnParallelLinear from L2/parallel_linear.h, never its QKVParallelLinear).
// OpContractCoverage still requires every op with facts to be reached with cases by some model.
inline std::vector<OpCase> op_cases_of(const std::vector<std::string>& models) {
  std::vector<OpCase> out;
  bench::CaseOptions small;
  small.small = true;
  for (const auto& m : models) {
    const engine::ModelSpec spec = engine::resolve_model(m);
    const ModelView view = bench::model_view(spec.name, spec.config, 1);
    for (int level = 1; level <= 3; ++level)
      for (const auto& op : bench::model_ops(view, level))
        if (!bench::cases_for(op, view, small).empty()) out.push_back({spec.name, op});
  }
  return out;
}

// The tiny test configs in models/ that a registered L4 serves.
inline std::vector<std::string> tiny_models() {
  std::vector<std::string> out;
  for (const auto& m : engine::known_models()) {
    if (m.rfind("tiny-", 0) != 0) continue;
    const auto archs = engine::resolve_model(m).config.architectures();
    for (const auto& e : registry(Variant::baseline).entries())
      for (const auto& a : e.architectures)
        if (!archs.empty() && a == archs.front()) out.push_back(m);
  }
  return out;
}

inline std::string op_case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string s = info.param.model + "_" + info.param.op;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Each of `cases` of `entry` through validate_candidate on `device` (the CPU oracle where the case fits), one seed.
inline void check_cases(const OpEntry& entry, const std::vector<BenchCase>& cases, Device device) {
  bench::ValidationOptions vo;
  vo.seeds = 1;
  constexpr uint64_t kSeed = 5;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op + " " + c.model + " " + c.label);
    auto base = bench::build_case_op(entry, c, device, kSeed);
    auto second = bench::build_case_op(entry, c, device, kSeed);
    std::unique_ptr<AnyOp> oracle;
    if (bench::fits_cpu_oracle(c)) oracle = bench::build_case_op(entry, c, Device::cpu(), kSeed);
    const bench::Validation v = bench::validate_candidate(c, entry, *base, *second, oracle.get(), device, kSeed, vo);
    EXPECT_TRUE(v.pass) << v.summary();
    EXPECT_GT(v.runs, 0);
  }
}

// Runs every case of (model, op) at `tokens` plus `random` random shapes through validate_candidate on `device`.
inline void check_op_contract(const OpCase& p, Device device, const std::vector<int64_t>& tokens, int random,
                              DType dtype) {
  const ModelView view = contract_view(engine::resolve_model(p.model));
  const OpEntry& entry = registry(Variant::baseline).get(p.op);
  const bool small = device.is_cpu();
  bench::CaseOptions o;
  o.tokens = tokens;
  o.dtype = dtype;
  o.small = small;
  std::vector<BenchCase> cases = bench::cases_for(p.op, view, o);
  for (auto& c : bench::random_cases(p.op, view, random, 11, small, dtype)) cases.push_back(std::move(c));
  ASSERT_FALSE(cases.empty()) << p.op << " has no cases for " << p.model;
  check_cases(entry, cases, device);
}

}  // namespace kbn::test
