#!/usr/bin/env bash
# Session 33, call J: call I cut to what little device time was left (refused starts spent the rest). The new
# kernels' GPU tests (bit checks against the ops they replace; the tiny models' L2/L3 contracts through them), then
# one latency-b1 pair off / dev per model (see callI.sh for the two binaries).
source tools/device_call.sh
unxz_to build-cmp/off.xz /tmp/off/kb_nano
st gpu_tests 75 build/tests/kbn_gpu_tests --gtest_filter='FusedMlaRopeCacheGpu.*:FusedQKNormRopeGpu.*:*tiny_deepseek_v2_deepseek_v2*:*tiny_qwen3_qwen3*:*tiny_qwen3_moe_qwen3*:*tiny_gemma3_gemma3*:*Families*tiny_deepseek_v2*:*Families*tiny_qwen3*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
E="eval --workload latency-b1 --num-requests 4 --mode graph --variant baseline --max-model-len 4096"
one() { local m=$1 b=$2 bin=build/kb_nano; [ $b != dev ] && bin=/tmp/$b/kb_nano
  st b1_${m}_$b 30 $bin $E --model $m --json $O/eval_b1_${m}_$b.json
  echo "  $m $b: $(grep -E 'TPOT' $O/b1_${m}_$b.log | head -1)"; }
for b in off dev; do one deepseek-v2-lite $b; one qwen3-30b-a3b $b; done
finish
