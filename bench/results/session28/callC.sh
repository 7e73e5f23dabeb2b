#!/usr/bin/env bash
# Session 28, call C. build-base/: binaries of 872c69e (before this session's code). build-dev/: this session's tree
# (fused_rope_kvcache on the Llama / Mixtral / gpt-oss attention path, the fixed fused_qk_norm_rope test) with session
# 27's last-block merge of flash_attn_decode as tasks/candidate/ (--variant both: baseline = no merge, candidate =
# merge). Latency-b1 of the old binary first, then the new one's tests (fused ops bit for bit against the ops they
# replace; the engine's graph tests, whose tiny Llama / gpt-oss / Mixtral now take the fused kernel), the fused op's
# kernel times beside rotary + store at Llama-3.1-8B's shapes, latency-b1 with both variants (A/B of the merge; against
# the old binary: the fused op), the decode A/B at Llama shapes, latency-b32 without / with --pdl.
set -u
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
B1="eval --workload latency-b1 --num-requests 8 --mode graph --max-model-len 4096"
build-base/unpack.sh
st eval_b1_old 40 build/kb_nano $B1 --variant baseline --json $O/eval_b1_old.json
build-dev/unpack.sh
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='FusedRopeKVCacheGpu.*:FusedQKNormRopeGpu.*:FlashAttnDecodeGpu.*:StoreKVCacheGpu.*:EngineGraphGpu.*' --gtest_output=json:$O/tests.json
st eval_b1 70 build/kb_nano $B1 --variant both --json $O/eval_b1.json
for p in off on; do
  fl=(); [ $p = on ] && fl=(--pdl)
  st eval_b32_pdl_$p 45 build/kb_nano eval --workload latency-b32 --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_b32_pdl_$p.json
done
st fused 50 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model llama-3.1-8b-instruct --target fused_rope_kvcache --target rotary_embedding --target store_kvcache --tokens 1,64 --json $O/fused.json
st llama 80 build/kb_nano kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_decode --model llama-3.1-8b-instruct --tokens 1,8,64 --json $O/llama.json
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log | tail -8
grep -E "T=|FAIL" $O/fused.log | head -20
echo "== llama"; grep -E "B=|ctx|geomean|FAIL" $O/llama.log | head -30
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|tok/s|floor|identical|align" $f | head -8; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
