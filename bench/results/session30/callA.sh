#!/usr/bin/env bash
# Session 30, call A: async scheduling (EngineConfig::async_scheduling; eval --compare-async-scheduling runs the
# baseline with synchronous steps, then with async scheduling, in one process). Its GPU tests (tiny models: async =
# synchronous tokens in eager and graph mode, EOS, preemption, nano-batches) with the engine's graph tests and Llama's
# (transformers' tokens); then latency-b1 (Llama-3.1-8B twice, Qwen3-30B-A3B, Qwen3-8B) sync vs async, a kernel
# trace of async Llama b1, and latency-b32 sync vs async.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 150 build/tests/kbn_gpu_tests --gtest_filter='*AsyncSchedulingGpu*:EngineGraphGpu.*:LlamaGpu.*' --gtest_output=json:$O/tests.json
E="build/kb_nano eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --compare-async-scheduling"
st b1_llama_1 70 $E --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_1.json
st b1_llama_2 70 $E --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_2.json
st b1_qwen3moe 80 $E --model qwen3-30b-a3b --json $O/eval_b1_qwen3-30b-a3b.json
st b1_qwen3 60 $E --model qwen3-8b --json $O/eval_b1_qwen3-8b.json
st b1_llama_trace 60 build/kb_nano eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --async-scheduling --kernel-trace --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_async_trace.json
st b32_llama 70 build/kb_nano eval --workload latency-b32 --num-requests 64 --mode graph --variant baseline --max-model-len 4096 --compare-async-scheduling --model llama-3.1-8b-instruct --json $O/eval_b32_llama-3.1-8b.json
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" $O/tests.log | head -30
for f in $O/b*.log; do echo "== $f"; grep -E "TPOT|floor / duration|greedy alignment|output tok/s" $f | head -6; done
grep -A14 "kernel time" $O/b1_llama_trace.log | head -20
cd $OUT && tar czf s.tgz s && rm -rf s  # one file back (the tool returns a handful)
