#!/usr/bin/env bash
# Session 29, call B: rms_norm_gemv (the norm folded into the one-token qkv / gate_up GEMV, silu*mul into gate_up's
# output; LlamaDecoderLayer takes it at one token). Its GPU tests (bitwise against the ops it replaces), the engine's
# and Llama's GPU tests (transformers' tokens, graph = eager), the tiny models' op contracts of the layer ops, the
# kernel beside the ops it replaces at Llama-3.1-8B's shapes, then latency-b1 A/B: build-base (86470c0, the three
# separate kernels) and build-dev (this tree), alternating, same machine.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 150 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemvGpu.*:FusedRopeKVCacheGpu.*:EngineGraphGpu.*:LlamaGpu.*:*tiny_llama*rms_norm_gemv*:*tiny_llama*llama_decoder_layer*:*tiny_llama*llama_for_causal_lm*' --gtest_output=json:$O/tests.json
st kernels 120 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model llama-3.1-8b-instruct --target rms_norm_gemv --target linear --target fused_add_rms_norm --target rms_norm --target silu_and_mul --tokens 1 --json $O/kernels.json
for r in 1 2; do
  st b1_base_$r 90 /tmp/base/kb_nano eval --model llama-3.1-8b-instruct --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_base_$r.json
  st b1_dev_$r 90 build/kb_nano eval --model llama-3.1-8b-instruct --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_dev_$r.json
done
st b1_dev_trace 120 build/kb_nano eval --model llama-3.1-8b-instruct --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 --kernel-trace --json $O/eval_b1_dev_trace.json
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure|vs " $O/tests.log | head -30
grep -E "T=1" $O/kernels.log | head -30
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
grep -A14 "kernel time" $O/b1_dev_trace.log
cd $OUT && tar czf s.tgz s && rm -rf s  # one file back (the tool returns a handful)
