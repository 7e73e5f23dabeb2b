#!/usr/bin/env bash
# Session 24, call 3 (call 1 timed out: ~9.5 s per fused_experts case, mostly the host's weights and oracle): the GPU
# tests of this session's changes, then fused_experts at decode sizes, uniform routing only, the new binary (GEMV
# decode path) against the previous one (grouped GEMMs), same machine, back to back.
set -u
build-dev/unpack.sh
mkdir -p build-old && gunzip -c build-dev/kb_nano_old.gz > build-old/kb_nano && chmod +x build-old/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st tests 150 build/tests/kbn_gpu_tests --gtest_filter='LinearGpu.F32*:FusedExpertsGpu.DecodePath*:FusedExpertsGpu.MatchesTheOracle:FusedExpertsGpu.OutOfRange*:FusedExpertsGpu.Swiglu*Oracle:GroupedTopkGpu.*:*tiny_deepseek_v3_deepseek_v2_moe*:*tiny_deepseek_v3_grouped_topk*:*tiny_deepseek_v2_deepseek_v2_moe*:*tiny_qwen3_moe_fused_experts*'
K() { local m=$1 v=$2; shift 2; local b=build/kb_nano; [ $v = old ] && b=build-old/kb_nano
  local cs=(); for c in "$@"; do cs+=(--case "$c"); done
  st k_${m}_$v 45 $b kernels --model $m --variant baseline --target fused_experts --random 0 --seeds 1 "${cs[@]}" --json $O/k_${m}_$v.json; }
for v in new old; do
  K qwen3-30b-a3b $v "T=1 E=128 k=8 H=2048 N=768 uniform" "T=8 E=128 k=8 H=2048 N=768 uniform"
  K mixtral-8x7b-instruct-v0.1 $v "T=1 E=8 k=2 H=4096 N=14336 uniform" "T=8 E=8 k=2 H=4096 N=14336 uniform"
  K gpt-oss-20b $v "T=1 E=32 k=4 H=2880 N=2880 uniform swigluoai bias"
done
cat $O/status.txt; grep -E "tests|PASSED|FAILED" $O/tests.log | tail -8
for f in $O/k_*.log; do echo "== $f"; grep -E "^\| T=" $f | cut -c1-150; done
cd $OUT && tar czf s.tgz s && rm -rf s
