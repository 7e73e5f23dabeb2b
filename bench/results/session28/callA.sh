#!/usr/bin/env bash
# Session 28, call A (binaries of 872c69e, build-base/): session 27's unverified work. fused_qk_norm_rope's GPU tests
# and the engine's with tiny Qwen3 / Gemma-3 (they take the fused kernel); the op beside the three it replaces at
# Qwen3-8B's shapes; the GPU tests under KBN_PDL=1 (pdl_wait now releases the next launch) and latency-b1 without /
# with --pdl for Llama-3.1-8B and Qwen3-30B-A3B.
set -u
build-base/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='FusedQKNormRopeGpu.*:EngineGraphGpu.*:*tiny_qwen3*:*tiny_gemma3*' --gtest_output=json:$O/tests.json
st qknorm 40 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model qwen3-8b --target fused_qk_norm_rope --target rms_norm --target rotary_embedding --tokens 1,8,64 --json $O/qknorm.json
F='EngineGraphGpu.*:*NanoBatchGpu*:LinearGpu.*:FusedExpertsGpu.*:FlashAttnDecodeGpu.*:TopkSoftmaxGpu.*:*RmsNorm*:RotaryEmbeddingGpu.*:SiluAndMul*:FusedQKNormRopeGpu.*'
st tests_pdl 140 env KBN_PDL=1 build/tests/kbn_gpu_tests --gtest_filter="$F" --gtest_output=json:$O/tests_pdl.json
for m in llama-3.1-8b-instruct qwen3-30b-a3b; do
  for p in off on; do
    fl=(); [ $p = on ] && fl=(--pdl)
    st eval_${m}_b1_pdl_$p 65 build/kb_nano eval --model $m --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_${m}_b1_pdl_$p.json
  done
done
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log $O/tests_pdl.log | tail -12
grep -E "T=|FAIL|us" $O/qknorm.log | head -30
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|tok/s|floor|identical|align" $f | head -6; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
