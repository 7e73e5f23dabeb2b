#!/usr/bin/env bash
# Session 24, call 2: batch-1 decode end to end with the GEMV decode path (new) against the previous binary (old),
# same machine, back to back: Qwen3-30B-A3B and gpt-oss-20b, eval's latency-b1 workload in graph mode.
set -u
build-dev/unpack.sh
mkdir -p build-old && gunzip -c build-dev/kb_nano_old.gz > build-old/kb_nano && chmod +x build-old/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
for m in qwen3-30b-a3b gpt-oss-20b; do
  for v in new old new2; do
    b=build/kb_nano; [ $v = old ] && b=build-old/kb_nano
    st e_${m}_$v 110 $b eval --model $m --workload latency-b1 --mode graph --num-requests 4 --max-model-len 4096 --json $O/e_${m}_$v.json
  done
done
cat $O/status.txt
for f in $O/e_*.log; do echo "== $f"; grep -i -E "tpot|floor|tok/s" $f | head -6; done
cd $OUT && tar czf s.tgz s && rm -rf s
