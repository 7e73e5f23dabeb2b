#!/usr/bin/env bash
# Session 29, call E (an H200 if one comes): Llama-3.1-8B latency-b1 with build-base (86470c0) and build-dev (78aaad9:
# rms_norm_gemv, fused_rope_kvcache on fp8 pages), alternating, for issue 20's batch-1 target; Qwen3-30B-A3B likewise.
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
for m in llama-3.1-8b-instruct qwen3-30b-a3b; do
  for r in 1 2; do
    st b1_${m}_base_$r 90 /tmp/base/kb_nano eval --model $m --workload latency-b1 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_${m}_base_$r.json
    st b1_${m}_dev_$r 90 build/kb_nano eval --model $m --workload latency-b1 --mode graph --variant baseline --max-model-len 4096 --json $O/eval_b1_${m}_dev_$r.json
    [ $m = qwen3-30b-a3b ] && break
  done
done
cat $O/status.txt
for f in $O/b1_*.log; do echo "== $f"; grep -E "TPOT|floor / duration" $f | head -2; done
cd $OUT && tar czf s.tgz s && rm -rf s  # one file back
