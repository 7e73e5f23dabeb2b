#!/usr/bin/env bash
# Session 24, call 1: the GPU tests of this session's changes, then fused_experts at decode sizes (1-8 tokens),
# the new binary (GEMV decode path) against the previous one (grouped GEMMs), same machine, back to back.
set -u
build-dev/unpack.sh
mkdir -p build-old && gunzip -c build-dev/kb_nano_old.gz > build-old/kb_nano && chmod +x build-old/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st tests 170 build/tests/kbn_gpu_tests --gtest_filter='LinearGpu.*:FusedExpertsGpu.*:MoeSumGpu.*:GroupedTopkGpu.*:*deepseek*:*qwen3_moe*:*mixtral*'
for m in qwen3-30b-a3b mixtral-8x7b-instruct-v0.1 gpt-oss-20b; do
  for v in new old; do
    b=build/kb_nano; [ $v = old ] && b=build-old/kb_nano
    st k_${m}_$v 75 $b kernels --model $m --variant baseline --target fused_experts --tokens 1,2,4,8 --random 0 --seeds 1 --json $O/k_${m}_$v.json
  done
done
tail -3 $O/tests.log; cat $O/status.txt
for f in $O/k_*.log; do echo "== $f"; grep -E "^\| T=" $f | cut -c1-170; done
cd $OUT && tar czf s.tgz s && rm -rf s
