#!/usr/bin/env bash
# Session 27, call 0 (the smallest call, for the device time left after refused starts): fused_qk_norm_rope's GPU
# tests and the engine's with tiny Qwen3 / Gemma-3 (head 32: the fused kernel), then the op beside the three it replaces
# at Qwen3-8B's shapes.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
K="build/kb_nano kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_decode"
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='FusedQKNormRopeGpu.*:EngineGraphGpu.*:*tiny_qwen3*:*tiny_gemma3*' --gtest_output=json:$O/tests.json
st qknorm 40 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model qwen3-8b --target fused_qk_norm_rope --target rms_norm --target rotary_embedding --tokens 1,8,64 --json $O/qknorm.json
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log | tail -5
for f in $O/llama*.log $O/gptoss.log $O/gemma.log; do echo "== $f"; grep -E "B=|ctx|geomean|FAIL" $f | head -40; done
grep -E "T=|FAIL" $O/qknorm.log | head -30
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|tok/s|floor|identical|align" $f | head -10; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
