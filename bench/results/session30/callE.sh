#!/usr/bin/env bash
# Session 30, call E (call D cut to what the device time left allows): tools/gemv_chain_bench.cu, then latency-b1
# Llama-3.1-8B with build-base (0e353da) and build-dev (the same tree + bench/results/session30/gemv_pipelined.patch:
# linear's one-token GEMV with its loads software-pipelined, same summation order). build-dev carries kb_nano only.
set -u
mkdir -p build/lib /tmp/base
gunzip -c build-dev/kb_nano.gz > build/kb_nano && chmod +x build/kb_nano && cp -L build-dev/lib/* build/lib/
gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st chain 50 bash -c "nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DKBN_VARIANT=baseline -Itasks/baseline tools/gemv_chain_bench.cu -o /tmp/gcb && /tmp/gcb 20"
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --model llama-3.1-8b-instruct"
st b1_llama_base 40 /tmp/base/kb_nano $E --json $O/eval_b1_llama-3.1-8b_base.json
st b1_llama_dev 40 build/kb_nano $E --json $O/eval_b1_llama-3.1-8b_dev.json
cat $O/status.txt; tail -22 $O/chain.log
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s
