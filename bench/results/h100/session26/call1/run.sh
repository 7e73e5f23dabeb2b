#!/usr/bin/env bash
# Session 26, call 1: the GPU tests of sessions 24-25's changes (router_gemm, fused_experts' decode path, GEMV with
# its peeled first iteration, nano-batches, dependent launch) plainly and again under KBN_PDL=1, then Llama-3.1-8B
# latency-b1 / latency-b32 in graph mode without and with --pdl, and Qwen3-30B-A3B latency-b1 (dependent launch now
# also in topk_softmax and fused_experts' decode GEMVs, GEMM 2 prefetching its rows), back to back on the same GPU.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 ))s: $*" >> $O/status.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $O/smi.csv 2>/dev/null &
F='EngineGraphGpu.*:*NanoBatchGpu*:RouterGemmGpu.*:LinearGpu.*:FusedExpertsGpu.*:FlashAttnDecodeGpu.*:StoreKVCacheGpu.*:*RmsNorm*:RotaryEmbeddingGpu.*:EmbeddingGpu.*:SiluAndMul*:GeluAndMul*:*Conv1d*:*SelectiveState*:*Mixer2*:MlaDecodeGpu.*:ConcatAndCacheMlaGpu.*:*tiny_deepseek_v3_router_gemm*:*tiny_deepseek_v2_router_gemm*:*tiny_deepseek_v2_deepseek_v2_moe*:TopkSoftmaxGpu.*:*tiny_qwen3_moe_fused_experts*:*tiny_qwen3_moe_topk_softmax*:*tiny_mixtral_mixtral_moe*'
st tests 200 build/tests/kbn_gpu_tests --gtest_filter="$F" --gtest_output=json:$O/tests.json
st tests_pdl 170 env KBN_PDL=1 build/tests/kbn_gpu_tests --gtest_filter="$F" --gtest_output=json:$O/tests_pdl.json
for w in latency-b1 latency-b32; do
  for p in off on; do
    fl=(); [ $p = on ] && fl=(--pdl)
    st eval_${w}_pdl_$p 60 build/kb_nano eval --workload $w --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_${w}_pdl_$p.json
  done
done
for p in off on; do
  fl=(); [ $p = on ] && fl=(--pdl)
  st eval_qwen3moe_latency-b1_pdl_$p 60 build/kb_nano eval --model qwen3-30b-a3b --workload latency-b1 --num-requests 4 --mode graph --variant baseline --max-model-len 4096 "${fl[@]}" --json $O/eval_qwen3moe_latency-b1_pdl_$p.json
done
kill %1 2>/dev/null
cat $O/status.txt; grep -E "PASSED|FAILED|tests ran" $O/tests.log $O/tests_pdl.log | tail -20
for f in $O/eval_*.log; do echo "== $f"; grep -E "TPOT|ITL|duration|tok/s|floor|identical|tokens" $f | head -8; done
cd $OUT && gzip -9 s/*.log && tar czf s.tgz s && rm -rf s
