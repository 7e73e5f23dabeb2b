#!/usr/bin/env bash
# Session 31, call D (call C's two starts were refused; this is its script with the conv fusion added):
# rms_norm_gemv with two weight rows per warp (two outputs, or one output's gate and up rows) and the fp32 h staged in
# shared memory (one pass over the inputs), and rms_norm_gemv_conv1d (Mamba-2's conv update in in_proj's epilogue at
# a decode token). build-base = kb_nano of 8f693cd (call B's dev); build-dev = this tree. GPU tests, kernel times of
# the dev rms_norm_gemv ops at Mamba's shapes, then latency-b1 base / dev alternated for Mamba-Codestral-7B and
# Llama-3.1-8B (one run each: the device budget was nearly spent on refused starts), then a kernel trace of the dev
# Mamba run.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st gpu_tests 90 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemv*:*Mamba*:*mamba*:EngineGraphGpu.*:*rms_norm_gemv*:*llama_decoder_layer*:*qwen3_decoder_layer*:*gemma3_decoder_layer*:LlamaGpu.*'
st k_conv1d_dev 40 build/kb_nano kernels --model mamba-codestral-7b-v0.1 --target rms_norm_gemv --target rms_norm_gemv_conv1d --target causal_conv1d_update --random 0 --seeds 1 --tokens 1 --json $O/k_conv1d_dev.json
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
m=mamba-codestral-7b-v0.1
for r in 1 2; do
  st b1_${m%%-*}_base$r 45 /tmp/base/kb_nano $E --model $m --json $O/eval_b1_${m%%-*}_base$r.json
  st b1_${m%%-*}_dev$r 45 build/kb_nano $E --model $m --json $O/eval_b1_${m%%-*}_dev$r.json
done
m=llama-3.1-8b-instruct
st b1_${m%%-*}_base1 45 /tmp/base/kb_nano $E --model $m --json $O/eval_b1_${m%%-*}_base1.json
st b1_${m%%-*}_dev1 45 build/kb_nano $E --model $m --json $O/eval_b1_${m%%-*}_dev1.json
st b1_mamba_trace 45 build/kb_nano $E --model mamba-codestral-7b-v0.1 --kernel-trace --json $O/eval_b1_mamba_trace.json
cat $O/status.txt; cat $O/gpu.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
for f in $O/k_*.log; do echo "== $f"; grep -E "T=1|B=1 " $f | head -6; done
grep -A14 "^kernel time" $O/b1_mamba_trace.log | cut -c1-150
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s
