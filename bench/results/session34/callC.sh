#!/usr/bin/env bash
# Session 34, call C (not run: the session's device time was spent). Build HEAD, then:
#   ninja -C build kb_nano tests/kbn_gpu_tests && tools/pack_device_build.sh            # dev = HEAD
#   git show fc97705:tasks/baseline/L1/fused_experts.cu > tasks/baseline/L1/fused_experts.cu
#   tools/relink_variant.sh build-cmp/old.xz "" tasks/baseline/L1/fused_experts.cu; git checkout tasks/baseline/L1/fused_experts.cu
#   git apply bench/results/session34/permute_batched_loads.patch
#   tools/relink_variant.sh build-cmp/perm.xz "" tasks/baseline/L1/fused_experts.cu; git checkout tasks/baseline/L1/fused_experts.cu
# and carry ["build-dev", "build-cmp"]. It checks 587ee73's final wide-tile path (the single-thread producer restored
# after call B's 10% Mixtral 4096 loss; compiled and CPU-tested only), the MoE GPU tests call B's limit cut off, and
# moe_permute with eight 16-byte loads in flight per lane (perm) at prefill sizes.
source tools/device_call.sh
for b in old perm; do unxz_to build-cmp/$b.xz /tmp/$b/kb_nano; done
st gpu_tests 120 build/tests/kbn_gpu_tests --gtest_filter='FusedExpertsGpu.*:MoeSumGpu.*:*tiny_qwen3_moe*:*tiny_mixtral*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
bin() { [ $1 = dev ] && echo build/kb_nano || echo /tmp/$1/kb_nano; }
K="kernels --target fused_experts --variant baseline --random 0 --seeds 1"
QC=(); for t in 16 256 4096 16384; do QC+=(--case "T=$t E=128 k=8 H=2048 N=768 uniform"); done
XC=(); for t in 16 256 4096; do XC+=(--case "T=$t E=8 k=2 H=4096 N=14336 uniform"); done
for r in 1 2; do for b in old dev perm; do
  st fe_qwen3_${b}_$r 60 $(bin $b) $K --model qwen3-30b-a3b --tokens 16,256,4096,16384 "${QC[@]}" --json $O/fe_qwen3_${b}_$r.json
  grep -E "uniform +(PASS|FAIL)" $O/fe_qwen3_${b}_$r.log | sed "s/^/  $b$r /"
  st fe_mixtral_${b}_$r 50 $(bin $b) $K --model mixtral-8x7b-instruct-v0.1 --tokens 16,256,4096 "${XC[@]}" --json $O/fe_mixtral_${b}_$r.json
  grep -E "uniform +(PASS|FAIL)" $O/fe_mixtral_${b}_$r.log | sed "s/^/  $b$r /"
done; done
st profile_qwen3_4k 90 build/kb_nano profile --target fused_experts --model qwen3-30b-a3b --tokens 4096 --case "T=4096 E=128 k=8 H=2048 N=768 uniform" --json $O/profile_qwen3_T4096.json --markdown $O/profile_qwen3_T4096.md
grep -E "moe_|kernel time" $O/profile_qwen3_T4096.md | head -12
finish
