#!/usr/bin/env bash
# Session 27, call 2: the rest of call 1's plan. flash_attn_decode with the last-block merge (candidate) against the
# baseline on fp8 pages (Llama-3.1-8B), gpt-oss-20b (head 64, window, sinks) and Gemma-3-12B (head 256) shapes;
# the merge's split cost at 64 keys; latency-b1 in graph mode with both variants; the engine / decode / GEMV GPU tests
# under KBN_PDL=1 (pdl_wait releasing the next kernel's launch), and latency-b1 without and with --pdl for Llama-3.1-8B
# and Qwen3-30B-A3B. About 10 minutes: split it if the device time left is short.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
K="build/kb_nano kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_decode"
F='EngineGraphGpu.*:*NanoBatchGpu*:LinearGpu.*:FusedExpertsGpu.*:FlashAttnDecodeGpu.*:TopkSoftmaxGpu.*:*RmsNorm*:RotaryEmbeddingGpu.*:SiluAndMul*:FusedQKNormRopeGpu.*'
st tests_pdl 150 env KBN_PDL=1 build/tests/kbn_gpu_tests --gtest_filter="$F" --gtest_output=json:$O/tests_pdl.json
st eval_b1 80 build/kb_nano eval --workload latency-b1 --mode graph --variant both --max-model-len 4096 --json $O/eval_b1.json
st llama_fp8 90 $K --model llama-3.1-8b-instruct --tokens 1,8,64 --kv-cache-dtype fp8 --json $O/llama_fp8.json
st llama_cost64 60 env KBN_DECODE_MERGE_COST=64 $K --model llama-3.1-8b-instruct --tokens 1,8 --json $O/llama_cost64.json
st gptoss 70 $K --model gpt-oss-20b --tokens 1,8 --json $O/gptoss.json
st gemma 70 $K --model gemma-3-12b-it --tokens 1,8 --json $O/gemma.json
for m in llama-3.1-8b-instruct qwen3-30b-a3b; do
  for p in off on; do
    fl=(); [ $p = on ] && fl=(--pdl)
    st eval_${m}_b1_pdl_$p 70 build/kb_nano eval --model $m --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_${m}_b1_pdl_$p.json
  done
done
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log | tail -5
for f in $O/llama*.log $O/gptoss.log $O/gemma.log; do echo "== $f"; grep -E "B=|ctx|geomean|FAIL" $f | head -40; done
grep -E "PASSED|FAILED|tests ran" $O/tests_pdl.log | tail -5
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|tok/s|floor|identical|align" $f | head -10; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
