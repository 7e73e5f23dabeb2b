#!/usr/bin/env bash
# Session 34, call A. Binaries (carry ["build-dev", "build-cmp"]):
#   dev (build-dev/): session 33's wiring (FusedMlaRopeCache on DeepSeek's path, FusedQKNormRope::forward_store on
#       Qwen3 / Gemma-3's) + fused_experts' changes: narrow tiles with 7 stages and a persistent grid; the producer
#       warp reads the next item's metadata one item ahead; consumers load the epilogue's pairs / weights before the
#       main loop (both tile widths).
#   off: dev with the two store fusions switched off (their candidate defines on the three L2 sources).
#   fe_old: dev with fused_experts.cu at HEAD (64787c8).
#   fe_5np: dev's fused_experts.cu with -DKBN_FE_NARROW_STAGES=5 -DKBN_FE_NARROW_PERSISTENT=0 (the prefetches alone).
#   fe_5p:  -DKBN_FE_NARROW_STAGES=5 (prefetches + persistent grid).
source tools/device_call.sh
for b in off fe_old fe_5np fe_5p; do unxz_to build-cmp/$b.xz /tmp/$b/kb_nano; done
st gpu_tests 100 build/tests/kbn_gpu_tests --gtest_filter='FusedExpertsGpu.*:MoeSumGpu.*:FusedMlaRopeCacheGpu.*:ConcatAndCacheMlaGpu.*:MlaDecodeGpu.*:FusedQKNormRopeGpu.*:*tiny_deepseek_v2_deepseek_v2*:*tiny_qwen3_qwen3*:*tiny_qwen3_moe*:*tiny_gemma3_gemma3*:*tiny_mixtral*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
bin() { [ $1 = dev ] && echo build/kb_nano || echo /tmp/$1/kb_nano; }
# fused_experts, uniform routing, decode sizes: the four builds alternated
QC=(); for t in 16 64 256; do QC+=(--case "T=$t E=128 k=8 H=2048 N=768 uniform"); done
XC=(); for t in 16 256 4096; do XC+=(--case "T=$t E=8 k=2 H=4096 N=14336 uniform"); done
K="kernels --target fused_experts --variant baseline --random 0 --seeds 1"
for r in 1 2; do for b in fe_old fe_5np fe_5p dev; do
  st fe_qwen3_${b}_$r 40 $(bin $b) $K --model qwen3-30b-a3b --tokens 16,64,256 "${QC[@]}" --json $O/fe_qwen3_${b}_$r.json
  grep -E "uniform" $O/fe_qwen3_${b}_$r.log | head -3 | sed "s/^/  $b$r /"
done; done
for b in fe_old dev; do
  st fe_mixtral_$b 50 $(bin $b) $K --model mixtral-8x7b-instruct-v0.1 --tokens 16,256,4096 "${XC[@]}" --json $O/fe_mixtral_$b.json
  grep -E "uniform" $O/fe_mixtral_$b.log | head -3 | sed "s/^/  $b /"
  st fe_qwen3_4k_$b 30 $(bin $b) $K --model qwen3-30b-a3b --tokens 4096 --case "T=4096 E=128 k=8 H=2048 N=768 uniform" --json $O/fe_qwen3_4k_$b.json
  grep -E "uniform" $O/fe_qwen3_4k_$b.log | head -1 | sed "s/^/  $b /"
done
# the store fusions at batch 1 (session 33's call I)
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
one() { st b1_$1_$2$3 40 $(bin $2) $E --model $1 --json $O/eval_b1_$1_$2$3.json
  echo "  $1 $2$3: $(grep -E 'TPOT' $O/b1_$1_$2$3.log | head -1)"; }
for r in 1; do for b in off dev; do one deepseek-v2-lite $b $r; one qwen3-30b-a3b $b $r; done; done
for b in off dev; do one gemma-3-12b-it $b 1; done
st kernels_mla 50 build/kb_nano kernels --model deepseek-v2-lite --variant baseline --target fused_mla_rope_cache --target concat_and_cache_mla --target rotary_embedding --tokens 1,4096 --random 0 --seeds 1 --json $O/kernels_mla.json
tail -12 $O/kernels_mla.log
# the router's top-k at one token, alone (cold and as a graph replay): what a fold into its neighbours can save
for md in cold graph; do
  st topk_$md 30 build/kb_nano kernels --target topk_softmax --model qwen3-30b-a3b --variant baseline --tokens 1 --random 0 --seeds 1 --mode $md --json $O/topk_$md.json
  grep -E "T=1" $O/topk_$md.log | head -2
done
st profile_qwen3 75 build/kb_nano profile --target fused_experts --model qwen3-30b-a3b --tokens 256 --case "T=256 E=128 k=8 H=2048 N=768 uniform" --json $O/profile_qwen3_T256.json --markdown $O/profile_qwen3_T256.md
grep -E "moe_expert_gemm|kernel time" $O/profile_qwen3_T256.md | head -8
st profile_qwen3_4k 75 build/kb_nano profile --target fused_experts --model qwen3-30b-a3b --tokens 4096 --case "T=4096 E=128 k=8 H=2048 N=768 uniform" --json $O/profile_qwen3_T4096.json --markdown $O/profile_qwen3_T4096.md
grep -E "moe_expert_gemm|kernel time" $O/profile_qwen3_T4096.md | head -8
finish
