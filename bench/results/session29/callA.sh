#!/usr/bin/env bash
# Session 29, call A: session 28's call D (the rotating ops' GPU tests after the rounding change and the fp8x4 refactor,
# the tiny models' op contracts of those ops, fused_rope_kvcache beside rotary + store at Llama-3.1-8B's shapes), then
# Llama-3.1-8B latency-b1 with --kernel-trace: the per-op GPU time of a batch-1 step as the tree stands (the fusions
# planned next aim at its small kernels).
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 100 build/tests/kbn_gpu_tests --gtest_filter='FusedRopeKVCacheGpu.*:FusedQKNormRopeGpu.*:RotaryEmbeddingGpu.*:StoreKVCacheGpu.*:EngineGraphGpu.*:*tiny*fused_rope_kvcache*:*tiny*rotary_embedding*:*tiny*fused_qk_norm_rope*' --gtest_output=json:$O/tests.json
st fused 60 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model llama-3.1-8b-instruct --target fused_rope_kvcache --target rotary_embedding --target store_kvcache --tokens 1,64 --json $O/fused.json
st b1_trace 120 build/kb_nano eval --model llama-3.1-8b-instruct --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --kernel-trace --json $O/eval_b1_trace.json
st b1 90 build/kb_nano eval --model llama-3.1-8b-instruct --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1.json
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure|vs " $O/tests.log | head -40; grep -E "T=" $O/fused.log | tail -12
grep -E "TPOT|floor" $O/b1.log | head; grep -A40 -i "kernel trace\|per op" $O/b1_trace.log | head -50
gzip -f $O/*.log
