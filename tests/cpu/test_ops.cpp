// Every registered op of every tiny model through the validation contract on CPU ops (tests/op_contract.h), and the
// ops that run ahead of their model at its real config.
#include <set>

#include "op_contract.h"

namespace {

using kbn::test::OpCase;

class OpContract : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpContract, CasesPassTheValidationContractOnCpu) {
  kbn::test::check_op_contract(GetParam(), kbn::Device::cpu(), {3, 300}, 1, kbn::DType::bf16);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, OpContract, ::testing::ValuesIn(kbn::test::op_cases_of(kbn::test::tiny_models())),
                         kbn::test::op_case_name);

// Ops ahead of their model's L4, at the real config's shapes (CPU-sized token counts).
INSTANTIATE_TEST_SUITE_P(PendingModels, OpContract, ::testing::ValuesIn(kbn::test::pending_model_op_cases()),
                         kbn::test::op_case_name);

// The generic test really covers the registry: every op that has test facts is reached by some tiny model, or runs
// at a real config's shapes until its model's L4 lands.
TEST(OpContractCoverage, EveryOpWithFactsIsReachedByATinyModel) {
  std::set<std::string> reached;
  for (const auto& c : kbn::test::op_cases_of(kbn::test::tiny_models())) reached.insert(c.op);
  for (const auto& c : kbn::test::pending_model_op_cases()) reached.insert(c.op);
  for (const auto& e : kbn::registry(kbn::Variant::baseline).entries())
    if (e.cases) EXPECT_TRUE(reached.count(e.name)) << e.name << " (" << e.source << ") is tested by no tiny model";
}

}  // namespace
