// Gemma-3 against Hugging Face transformers' Gemma3ForCausalLM (tests/hf_fixture.h; fixture made on the H200 by
// tools/hf_reference.py --config models/tiny-gemma3.json). The tiny config puts a sliding window of 8 on layers 0 and
// 1 and full attention on layer 2, with a local rope base, linear rope scaling on the global layers,
// query_pre_attn_scalar 24 (not head_dim 32), tied embeddings and the embedding scale sqrt(hidden): prompts of 11
// and 23 tokens and 16 greedy tokens cross the window, so a window off by one, the wrong rope on either layer kind
// or the wrong attention scale moves these logits past the tolerance.
#include <gtest/gtest.h>

#include "hf_fixture.h"

TEST(Gemma3VsHF, TinySlidingAndGlobalLayersLogitsAndGreedyTokens) { kbn::test::check_against_hf("tiny-gemma3"); }
