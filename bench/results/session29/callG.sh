#!/usr/bin/env bash
# Session 29, call G: rms_norm_gemv with GemmaRMSNorm and gelu_tanh*mul in Gemma3DecoderLayer (one token). Its GPU
# tests (bitwise against the separate ops, Gemma-3-12B shapes included), the tiny Gemma-3 op contracts, the engine's
# graph tests; then Gemma-3-12B latency-b1 base (86470c0) / dev.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemvGpu.*:*tiny_gemma3*:EngineGraphGpu.*' --gtest_output=json:$O/tests.json
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure|vs " $O/tests.log | head -20
st b1_base 40 /tmp/base/kb_nano eval --model gemma-3-12b-it --workload latency-b1 --num-requests 4 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_gemma-3-12b_base.json
st b1_dev 40 build/kb_nano eval --model gemma-3-12b-it --workload latency-b1 --num-requests 4 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_gemma-3-12b_dev.json
tail -2 $O/status.txt
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s  # one file back
