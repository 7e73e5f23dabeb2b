#!/usr/bin/env bash
# Session 30, call C: the MLA page-table fix (tiny DeepSeek-V2's async-scheduling GPU test faulted in call B), the
# async-scheduling GPU tests of every family, the nano-batch / graph / DeepSeek GPU tests; then kernel traces with
# the new attribution (busy time charged to the oldest kernel running) of batch-1 decode: Llama-3.1-8B, Qwen3-30B-A3B,
# DeepSeek-V2-Lite, Mamba-Codestral-7B.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 200 build/tests/kbn_gpu_tests --gtest_filter='*AsyncSchedulingGpu*:*NanoBatchGpu*:EngineGraphGpu.*:*eepseek*:*eepSeek*:*Mla*:*MLA*' --gtest_output=json:$O/tests.json
T="build/kb_nano eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --kernel-trace"
st b1_llama_trace 60 $T --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_trace.json
st b1_qwen3moe_trace 60 $T --model qwen3-30b-a3b --json $O/eval_b1_qwen3-30b-a3b_trace.json
st b1_dsv2_trace 80 $T --model deepseek-v2-lite --json $O/eval_b1_deepseek-v2-lite_trace.json
st b1_mamba_trace 80 $T --model mamba-codestral-7b-v0.1 --json $O/eval_b1_mamba-codestral-7b_trace.json
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" $O/tests.log | head -30
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; grep -A16 "kernel time" $f | head -18; done
cd $OUT && tar czf s.tgz s && rm -rf s
