#!/usr/bin/env bash
# Session 33, call H (session 32's call H, not run then, plus DeepSeek's shared experts summed in fused_experts). base = kb_nano of 8f693cd (the code of e483de5); dev =
# this tree: rotary_embedding on head-strided views (DeepSeek's MLA rotates q's rope part in place) and Qwen3-MoE's
# post-attention norm folded into the router at one token (rms_norm_gemv forward_normed). GPU tests, then latency-b1
# base / dev alternated; DeepSeek-V2-Lite: the shared experts' output added in fused_experts' one-token down kernel (TP 1).
source tools/device_call.sh
unxz_to build-cmp/base.xz /tmp/base/kb_nano
st gpu_tests 150 build/tests/kbn_gpu_tests --gtest_filter='RotaryEmbeddingGpu.*:RMSNormGemvGpu.*:*Qwen3Moe*:*qwen3_moe*:EngineGraphGpu.*:*llama_decoder_layer*:*deepseek*:*Mla*:GroupedTopkGpu.*:FusedExpertsGpu.*:MoeSumGpu.*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
one() { local m=$1 b=$2 r=$3 bin=build/kb_nano; [ $b != dev ] && bin=/tmp/$b/kb_nano
  st b1_${m}_$b$r 45 $bin $E --model $m --json $O/eval_b1_${m}_$b$r.json
  echo "  $m $b$r: $(grep -E 'TPOT' $O/b1_${m}_$b$r.log | head -1)"; }
for r in 1 2; do for b in base dev; do one qwen3-30b-a3b $b $r; one deepseek-v2-lite $b $r; done; done
for b in base dev; do one llama-3.1-8b-instruct $b 1; done
finish
