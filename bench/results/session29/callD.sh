#!/usr/bin/env bash
# Session 29, call D: rms_norm_gemv in Qwen3, Qwen3-MoE and Mixtral (tree 78aaad9). The GPU tests of the tiny Qwen3 /
# Qwen3-MoE / Mixtral ops and layers (op contracts against the oracle, at one token through the fused path), the
# engine's graph tests, the kernel-trace test fixed after call C; then latency-b1 A/B on Qwen3-30B-A3B (norm + qkv
# fused; its MoE layers keep the post-attention norm) and Qwen3-8B (both fusions): build-base (86470c0) against
# build-dev, alternating, same machine. Mixtral-8x7B (93 GB of bf16 weights) does not fit an H100.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 200 build/tests/kbn_gpu_tests --gtest_filter='*tiny_qwen3*:*tiny_mixtral*:*tiny_llama*rms_norm_gemv*:EngineGraphGpu.*:KernelTraceGpu.*:RMSNormGemvGpu.*' --gtest_output=json:$O/tests.json
for m in qwen3-30b-a3b qwen3-8b; do
  for r in 1 2; do
    st b1_${m}_base_$r 90 /tmp/base/kb_nano eval --model $m --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_${m}_base_$r.json
    st b1_${m}_dev_$r 90 build/kb_nano eval --model $m --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_${m}_dev_$r.json
    [ $m = qwen3-8b ] && break
  done
done
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" $O/tests.log | head -30
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s  # one file back
