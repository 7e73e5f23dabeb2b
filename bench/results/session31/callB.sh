#!/usr/bin/env bash
# Session 31, call B: Mamba-2's batch-1 decode. build-base = kb_nano of afa4e2a (session start); build-dev = this tree:
# rms_norm_gemv with the fp32 residual (Mamba2DecoderLayer's norm + in_proj at one token), the state update and the
# conv update loading their state (and the conv taps) before the dependent-launch wait. GPU tests of what changed,
# then the two decode ops base vs dev, then latency-b1 base / dev alternated.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st gpu_tests 150 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemvGpu.*:*Mamba*:*mamba*:*SelectiveStateUpdate*:*CausalConv1d*:*StateEngine*:EngineGraphGpu.*:*AsyncScheduling*'
M="--model mamba-codestral-7b-v0.1"
K="kernels $M --target selective_state_update --target causal_conv1d_update --random 0 --seeds 1 --tokens 1,8,32,256"
st k_base 90 /tmp/base/kb_nano $K --json $O/k_decode_base.json
st k_dev 90 build/kb_nano $K --json $O/k_decode_dev.json
st k_norm_gemv 60 build/kb_nano kernels $M --target rms_norm_gemv --target rms_norm --target linear --random 0 --seeds 1 --tokens 1 --json $O/k_norm_gemv_dev.json
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 $M"
st b1_base1 45 /tmp/base/kb_nano $E --json $O/eval_b1_mamba_base1.json
st b1_dev1 45 build/kb_nano $E --json $O/eval_b1_mamba_dev1.json
st b1_base2 45 /tmp/base/kb_nano $E --json $O/eval_b1_mamba_base2.json
st b1_dev2 45 build/kb_nano $E --json $O/eval_b1_mamba_dev2.json
cat $O/status.txt; cat $O/gpu.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
for f in $O/k_base.log $O/k_dev.log $O/k_norm_gemv.log; do echo "== $f"; grep -E "us|PASS|FAIL" $f | grep -v "^ *$" | head -24; done
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration|serial floor s" $f | head -3; done
cd $OUT && tar czf s.tgz s && rm -rf s
