#!/usr/bin/env bash
# Session 26, call 2: overlapped nano-batches (issue 20 item 3) on Llama-3.1-8B balanced, graph mode:
# eval --compare-nano-batches (whole steps, then 2 nano-batches, same requests, tokens aligned) with the balanced
# and the by-kind split, then the balanced split with the nano-batches' GEMMs aimed at 100 SMs (400 requests).
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
E=(build/kb_nano eval --workload balanced --mode graph --variant baseline --max-model-len 4096 --nano-batches 2 --compare-nano-batches)
st nano_balanced 200 "${E[@]}" --nano-batch-split balanced --json $O/nano_balanced.json
st nano_kind 200 "${E[@]}" --nano-batch-split kind --json $O/nano_kind.json
st nano_balanced_sms100 150 "${E[@]}" --nano-batch-split balanced --nano-batch-gemm-sms 100 --num-requests 400 --json $O/nano_balanced_sms100.json
kill %1 2>/dev/null
cat $O/status.txt
for f in $O/nano_*.log; do echo "== $f"; grep -E "output tokens/s|duration s|floor|nano-batched|graph steps|greedy|align|diverg|identical" $f | head -16; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
