#!/usr/bin/env bash
# Session 31, call A: the H200 (or H100) figures of this tree at batch 1, session 30's GEMV experiment, the GPU
# tests changed since 0e353da. build-dev: kb_nano + kbn_gpu_tests of HEAD (afa4e2a), kb_nano_pgemv.gz = the same
# tree + bench/results/session30/gemv_pipelined.patch (linear's one-token GEMV loads software-pipelined).
set -u
build-dev/unpack.sh
mkdir -p /tmp/dev && gunzip -c build-dev/kb_nano_pgemv.gz > /tmp/dev/kb_nano && chmod +x /tmp/dev/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st chain 50 bash -c "nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DKBN_VARIANT=baseline -Itasks/baseline tools/gemv_chain_bench.cu -o /tmp/gcb && /tmp/gcb 20"
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
L="--model llama-3.1-8b-instruct"
st b1_llama_base1 45 build/kb_nano $E $L --json $O/eval_b1_llama-3.1-8b_base1.json
st b1_llama_dev1 45 /tmp/dev/kb_nano $E $L --json $O/eval_b1_llama-3.1-8b_dev1.json
st b1_llama_base2 45 build/kb_nano $E $L --json $O/eval_b1_llama-3.1-8b_base2.json
st b1_llama_dev2 45 /tmp/dev/kb_nano $E $L --json $O/eval_b1_llama-3.1-8b_dev2.json
st b1_qwen3_8b_base 45 build/kb_nano $E --model qwen3-8b --json $O/eval_b1_qwen3-8b_base.json
st b1_qwen3_8b_dev 45 /tmp/dev/kb_nano $E --model qwen3-8b --json $O/eval_b1_qwen3-8b_dev.json
st b1_qwen3_moe_base 60 build/kb_nano $E --model qwen3-30b-a3b --json $O/eval_b1_qwen3-30b-a3b_base.json
st gpu_tests 120 build/tests/kbn_gpu_tests --gtest_filter='AsyncSchedulingGpu*:EngineGraphGpu*:NanoBatchGpu*'
cat $O/status.txt; cat $O/gpu.txt; tail -22 $O/chain.log
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -3; done
tail -5 $O/gpu_tests.log
cd $OUT && tar czf s.tgz s && rm -rf s
