#pragma once
// A MoE router's GEMM with f32 logits: logits = x @ weight^T, fp32 accumulation, never rounded to 16 bits. DeepSeek's
// gates compute F.linear(x.float(), weight.float()) (DeepSeek's MoEGate, HF's DeepseekV3TopkRouter; vLLM's
// dsv3_router_gemm keeps bf16 operands and f32 logits, as this does): a logit rounded to bf16 ties experts whose scores
// differ by less than its ulp, and the tie then goes to the lower index. On the GPU through cuBLASLt
// (kbn/cublaslt_linear.h); on the CPU the linear oracle's double sums rounded once to f32.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class RouterGemm : public Module {
 public:
  RouterGemm() = default;
  // x: [num_tokens, hidden] (row stride free, last dim contiguous; f32, f16 or bf16); weight: [num_experts, hidden]
  // contiguous, x's dtype -> new [num_tokens, num_experts] f32
  Tensor forward(const Tensor& x, const Tensor& weight);
};

}  // namespace kbn::KBN_VARIANT
