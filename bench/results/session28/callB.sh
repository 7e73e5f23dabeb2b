#!/usr/bin/env bash
# Session 28, call B (build-dev/: 872c69e + the test fix of fused_qk_norm_rope's padded rows + session 27's last-block
# merge of flash_attn_decode as tasks/candidate/): fused_qk_norm_rope's GPU tests again; the op beside the three it
# replaces at Qwen3-8B's shapes; decode A/B (baseline vs last-block merge) at Llama-3.1-8B shapes;
# latency-b1 in graph mode with both variants; Llama-3.1-8B latency-b32 without / with --pdl.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
K="build/kb_nano kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_decode"
st tests 40 build/tests/kbn_gpu_tests --gtest_filter='FusedQKNormRopeGpu.*:FlashAttnDecodeGpu.*' --gtest_output=json:$O/tests.json
st llama 110 $K --model llama-3.1-8b-instruct --tokens 1,8,64 --json $O/llama.json
st eval_b1 90 build/kb_nano eval --workload latency-b1 --num-requests 8 --mode graph --variant both --max-model-len 4096 --json $O/eval_b1.json
st qknorm 100 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model qwen3-8b --target fused_qk_norm_rope --target rms_norm --target rotary_embedding --tokens 1,8,64 --json $O/qknorm.json
for p in off on; do
  fl=(); [ $p = on ] && fl=(--pdl)
  st eval_b32_pdl_$p 55 build/kb_nano eval --workload latency-b32 --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_b32_pdl_$p.json
done
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log | tail -5
for f in $O/llama.log; do echo "== $f"; grep -E "B=|ctx|geomean|FAIL" $f | head -40; done
grep -E "T=|FAIL" $O/qknorm.log | head -30
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|tok/s|floor|identical|align" $f | head -10; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
