#!/usr/bin/env bash
# session 21, call 4: fp8 KV end to end, Llama-3.1-8B random weights: baseline = fp8 pages on the TMA prefill kernel,
# candidate = 356ee5d^'s flash_attn_prefill (fp8 pages on mma.sync) [+ a rejected mla_decode candidate Llama never runs]
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st prefill 150 build/kb_nano_tune eval --model llama-3.1-8b-instruct --workload prefill-heavy --num-requests 200 --mode graph --variant both --kv-cache-dtype fp8 --max-model-len 4096 --json $o/eval_prefill_fp8.json
grep -hiE "tok/s|throughput|floor" $o/prefill.log | head -12
st balanced 150 build/kb_nano_tune eval --model llama-3.1-8b-instruct --workload balanced --num-requests 400 --mode graph --variant both --kv-cache-dtype fp8 --max-model-len 4096 --json $o/eval_balanced_fp8.json
grep -hiE "tok/s|throughput|floor" $o/balanced.log | head -12
