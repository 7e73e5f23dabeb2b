#!/usr/bin/env bash
# Session 26, call 5: overlapped nano-batches in eager mode (every step eager, so decode steps split too), Llama-3.1-8B
# balanced, 400 requests: the by-kind split with nano-batches down to 64 tokens (--nano-batch-min-tokens 64), so decode steps split.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
E=(build/kb_nano eval --workload balanced --mode eager --variant baseline --max-model-len 4096 --nano-batches 2 --compare-nano-batches --num-requests 400)
st nano_eager_kind_min64 150 "${E[@]}" --nano-batch-split kind --nano-batch-min-tokens 64 --json $O/nano_eager_kind_min64.json
cat $O/status.txt
for f in $O/nano_*.log; do echo "== $f"; grep -E "output tokens/s|duration s|floor / duration|overlap floor s|nano-batched|greedy" $f | head -8; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
