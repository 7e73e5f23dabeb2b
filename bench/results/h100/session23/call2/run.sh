#!/usr/bin/env bash
# session 23, call 2: two candidates against call 1's binary (build/kb_nano_old) in the same call: the fp8 store
# eight elements per thread (store_kvcache_fp8x8_kernel) against the scalar fp8 store, and the TMA prefill kernel's
# epilogue with a quad transpose (16-byte stores) against 4-byte stores. GPU tests, `kernels` both binaries, and
# Llama-3.1-8B balanced (200 requests, graph, --kernel-trace) with bf16 and fp8 KV on the new binary.
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_old.gz > build/kb_nano_old && chmod +x build/kb_nano_old
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st tests 200 build/tests/kbn_gpu_tests --gtest_filter='StoreKVCacheGpu.*:*OpContractGpu*store_kvcache*:FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*:*OpContractGpu*flash_attn_prefill*:LlamaGpu.*:EngineGraphGpu.*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
for b in kb_nano kb_nano_old; do
  for kv in auto fp8; do
    st store_${b}_$kv 60 build/$b kernels --variant baseline --target store_kvcache --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 1,8,64,512,4096,16384 --kv-cache-dtype $kv --seeds 1 --random 0 --json $o/store_${b}_$kv.json
    grep -hE "^T=" $o/store_${b}_$kv.log | cut -c1-120
  done
done
row(){ grep -hE "^seqs=" $o/$1.log | cut -c1-150; }
for b in kb_nano kb_nano_old; do
  st pre_$b 100 build/$b kernels --variant baseline --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --model llama-3.1-8b-instruct --model gemma-3-12b-it --tokens 4096,16384 --json $o/pre_$b.json
  row pre_$b
done
st synccheck 60 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnFeaturesGpu.GptOssLikeWindowAndSinks'
tail -1 $o/synccheck.log
for kv in auto fp8; do
  st eval_$kv 170 build/kb_nano eval --model llama-3.1-8b-instruct --workload balanced --num-requests 200 --mode graph --max-model-len 4096 --kernel-trace --kv-cache-dtype $kv --json $o/eval_$kv.json
  grep -E "total tokens/s|floor / duration|^  (linear|flash_attn|store_kv)|measured" $o/eval_$kv.log | head -12
done
