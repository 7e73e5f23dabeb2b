#!/usr/bin/env bash
# Session 34, call B. Binaries (carry ["build-dev", "build-cmp"]):
#   dev (build-dev/): fc97705 + topk_softmax sized to the experts (kPerLane 1..16 instead of 16) + fused_experts'
#       changes (call A's: narrow tiles 7 stages + persistent grid, metadata read ahead; and moe_permute copying real
#       rows only, 32 rows per block) + grouped_topk's k lanes writing the choices (no read-back from global memory).
#   old: dev with fused_experts.cu, topk_softmax.cu and grouped_topk.cu at fc97705.
#   nowide: dev with -DKBN_FE_WIDE_EARLY_LOADS=0 (the wide tiles' epilogue loads after the main loop, as before).
source tools/device_call.sh
for b in old nowide; do unxz_to build-cmp/$b.xz /tmp/$b/kb_nano; done
st gpu_tests 80 build/tests/kbn_gpu_tests --gtest_filter='TopkSoftmaxGpu.*:GroupedTopk*:*tiny_deepseek_v2_deepseek_v2*:FusedExpertsGpu.*:MoeAlign*:MoeSumGpu.*:*tiny_qwen3_moe*:*tiny_mixtral*:*tiny_gpt_oss*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
bin() { [ $1 = dev ] && echo build/kb_nano || echo /tmp/$1/kb_nano; }
for b in old dev; do for m in qwen3-30b-a3b mixtral-8x7b-instruct-v0.1 gpt-oss-20b; do
  st topk_${m}_$b 20 $(bin $b) kernels --target topk_softmax --model $m --variant baseline --tokens 1,64 --random 0 --seeds 1 --mode graph --json $O/topk_${m}_$b.json
  grep -E "^T=" $O/topk_${m}_$b.log | sed "s/^/  $m $b /"
done; done
for b in old dev; do
  st gtopk_$b 20 $(bin $b) kernels --target grouped_topk --model deepseek-v2-lite --variant baseline --tokens 1,64 --random 0 --seeds 1 --mode graph --json $O/gtopk_$b.json
  grep -E "^T=" $O/gtopk_$b.log | sed "s/^/  grouped_topk $b /"
done
K="kernels --target fused_experts --variant baseline --random 0 --seeds 1"
QC=(); for t in 16 256 4096; do QC+=(--case "T=$t E=128 k=8 H=2048 N=768 uniform"); done
fe() { local b=$1 r=$2
  st fe_qwen3_${b}_$r 40 $(bin $b) $K --model qwen3-30b-a3b --tokens 16,256,4096 "${QC[@]}" --json $O/fe_qwen3_${b}_$r.json
  grep -E "uniform +(PASS|FAIL)" $O/fe_qwen3_${b}_$r.log | sed "s/^/  $b$r /"
  st fe_mixtral_${b}_$r 30 $(bin $b) $K --model mixtral-8x7b-instruct-v0.1 --tokens 4096 --case "T=4096 E=8 k=2 H=4096 N=14336 uniform" --json $O/fe_mixtral_${b}_$r.json
  grep -E "uniform +(PASS|FAIL)" $O/fe_mixtral_${b}_$r.log | sed "s/^/  $b$r /"; }
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
one() { st b1_$1_$2$3 40 $(bin $2) $E --model $1 --json $O/eval_b1_$1_$2$3.json
  echo "  $1 $2$3: $(grep -E 'TPOT' $O/b1_$1_$2$3.log | head -1)"; }
for b in old nowide dev; do fe $b 1; done
for b in old dev; do one qwen3-30b-a3b $b 1; one deepseek-v2-lite $b 1; done
for b in old dev; do fe $b 2; done
for b in old dev; do one qwen3-30b-a3b $b 2; one deepseek-v2-lite $b 2; done
finish
