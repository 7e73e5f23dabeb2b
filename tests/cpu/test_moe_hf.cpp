// The MoE families against Hugging Face transformers (tests/hf_fixture.h), fixtures generated on the H200 by
// tools/hf_reference.py with transformers 5.17 (which saves the experts one tensor per expert and projection, as the
// published checkpoints hold them):
//   tiny-mixtral: 4 experts, top-2 without a norm_topk_prob key (Mixtral always renormalises), every layer sparse,
//     GQA 4/2, peaked weights (initializer_range 0.08);
//   tiny-qwen3-moe: 8 experts, top-2 with norm_topk_prob, layer 1 dense (mlp_only_layers) between two sparse ones,
//     per-head q/k norms, head_dim 32 over hidden 64.
// A wrong routing (softmax over the wrong axis, no renormalisation, the gate and up halves swapped, the routing
// weight applied twice or not at all) or a wrong sparse/dense layer moves the logits far past the tolerance.
#include <gtest/gtest.h>

#include "hf_fixture.h"

TEST(MixtralVsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-mixtral"); }

TEST(Qwen3MoeVsHF, TinyLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-qwen3-moe"); }
