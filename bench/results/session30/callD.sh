#!/usr/bin/env bash
# Session 30, call D: the one-token GEMV's loads software-pipelined (linear.cu: two register buffers, the next chunk in
# flight during the current chunk's dot products; same summation order). tools/gemv_chain_bench.cu (GEMV variants
# over one token's Llama-3.1-8B weights, checked bit-equal on lm_head's output), linear's kernel cases base / dev, then
# latency-b1 Llama-3.1-8B and Mamba-Codestral-7B base / dev. build-base: this session's kb_nano before the change
# (0e353da's build); build-dev carries kb_nano only (the carry limit).
set -u
mkdir -p build/lib /tmp/base
gunzip -c build-dev/kb_nano.gz > build/kb_nano && chmod +x build/kb_nano && cp -L build-dev/lib/* build/lib/
gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st chain 60 bash -c "nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DKBN_VARIANT=baseline -Itasks/baseline tools/gemv_chain_bench.cu -o /tmp/gcb && /tmp/gcb 20"
K="kernels --variant baseline --no-composition --random 0 --seeds 1 --model llama-3.1-8b-instruct --target linear --tokens 1"
st kernels_base 40 /tmp/base/kb_nano $K --json $O/kernels_linear_base.json
st kernels_dev 40 build/kb_nano $K --json $O/kernels_linear_dev.json
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
st b1_llama_base 45 /tmp/base/kb_nano $E --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_base.json
st b1_llama_dev 45 build/kb_nano $E --model llama-3.1-8b-instruct --json $O/eval_b1_llama-3.1-8b_dev.json
st b1_mamba_base 35 /tmp/base/kb_nano $E --model mamba-codestral-7b-v0.1 --json $O/eval_b1_mamba-codestral-7b_base.json
st b1_mamba_dev 35 build/kb_nano $E --model mamba-codestral-7b-v0.1 --json $O/eval_b1_mamba-codestral-7b_dev.json
cat $O/status.txt; cat $O/chain.log | tail -22
grep -E "T=1" $O/kernels_*.log
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s
