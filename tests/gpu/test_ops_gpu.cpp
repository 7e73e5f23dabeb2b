// Every registered op through the validation contract on the GPU (tests/op_contract.h): the tiny models and the
// real 8B configs' and DeepSeek-V2-Lite's shapes, the ops ahead of their model at gpt-oss-20b's and Gemma-3-12B's, decode and prefill
// token counts, two random shapes each.
#include "op_contract.h"

namespace {

using kbn::test::OpCase;

std::vector<std::string> gpu_models() {
  std::vector<std::string> m = kbn::test::tiny_models();
  m.push_back("llama-3.1-8b-instruct");
  m.push_back("qwen3-8b");
  m.push_back("deepseek-v2-lite");  // the latent kernels run at 512 + 64 only at a real DeepSeek shape
  return m;
}

class OpContractGpu : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpContractGpu, CasesPassTheValidationContractOnTheGpu) {
  kbn::test::check_op_contract(GetParam(), kbn::Device::cuda(0), {1, 37, 300}, 2, kbn::DType::bf16);
}

INSTANTIATE_TEST_SUITE_P(Models, OpContractGpu, ::testing::ValuesIn(kbn::test::op_cases_of(gpu_models())),
                         kbn::test::op_case_name);

// Ops ahead of their model's L4 (gpt-oss-20b, Gemma-3-12B) at the real configs' shapes.
INSTANTIATE_TEST_SUITE_P(PendingModels, OpContractGpu, ::testing::ValuesIn(kbn::test::pending_model_op_cases()),
                         kbn::test::op_case_name);

}  // namespace
