#pragma once
// The batched matmul of multi-head latent attention (vLLM's MLA runs torch.bmm there): each head's up-projection
// absorbed into the query (q_nope -> latent through W_UK) and into the attention output (latent -> v through W_UV),
// one GEMM per head with Linear's convention, out[b] = x[b] @ weight[b]^T, no bias. The operands are per-head views:
// x and out walk a token-major [num_tokens, num_heads, width] tensor head by head, so batch and row strides are free.
// On the GPU, one cuBLASLt strided-batched GEMM with the heuristic's algorithm cached per shape and strides.
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class Bmm : public Module {
 public:
  Bmm() = default;
  // x: [batch, M, K] (last dim contiguous, any batch and row strides, e.g. q.as_strided({H, T, P}, {D, H*D, 1}, off));
  // weight: [batch, N, K] contiguous; out: [batch, M, N] (last dim contiguous, any batch and row strides whose
  // elements do not overlap, e.g. columns [0, N) of each head of a wider [T, H, W] tensor). f32, f16 or bf16, all
  // three the same, on one device; out must not overlap x or weight. M = 0 is a no-op. Mutates out.
  void forward(const Tensor& x, const Tensor& weight, const Tensor& out);
};

}  // namespace kbn::KBN_VARIANT
