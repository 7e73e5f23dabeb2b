#!/usr/bin/env bash
# session 23, call 1: (a) mla_decode's warpgroup kernel with S in two accumulator chains, the scale folded into the
# exp2 fma, masks only on the last tile and lazy rescaling (baseline = session 22's candidate patch applied) vs d97bb29
# (candidate): tests, synccheck, A/B; (b) Llama-3.1-8B balanced (200 requests, graph) with bf16 and fp8 KV under
# --kernel-trace: which ops lose time with fp8 pages; (c) gpt-oss window-128 prefill at 8k under ncu with SASS source
# (the per-item overhead of the sliding-window case). Also the fp8 KV scales (k_scale / v_scale) on every attention
# kernel and the store: GPU tests and `kernels --kv-cache-dtype fp8` validation (cases run with k 1.25 / v 0.75).
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
row(){ grep -hE "^(seqs|B)=|Summary" $o/$1.log | cut -c1-140; }
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*:*OpContractGpu*mla_decode*:ConcatAndCacheMlaGpu.*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st scales 150 build/tests/kbn_gpu_tests --gtest_filter='FlashAttnDecodeGpu.*:FlashAttnPrefillGpu.Fp8*:FlashAttnFeaturesGpu.*:StoreKVCacheGpu.*' --gtest_output=json:$o/gpu_tests_scales.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/scales.log; grep -B2 -A12 "Failure" $o/scales.log | head -30
st kfp8 120 build/kb_nano kernels --variant baseline --target flash_attn_decode --target flash_attn_prefill --target store_kvcache --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 1,64,4096 --kv-cache-dtype fp8 --seeds 1 --json $o/kernels_fp8.json
row kfp8; grep -hE "^T=|valid|FAIL" $o/kfp8.log | head -20
st kbf16 60 build/kb_nano kernels --variant baseline --target store_kvcache --model llama-3.1-8b-instruct --tokens 1,64,4096 --seeds 1 --json $o/kernels_store_bf16.json
grep -hE "^T=" $o/kbf16.log
st abmla 90 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target mla_decode --model deepseek-v3 --model deepseek-v2-lite --tokens 8,32,64,128 --json $o/ab_mla.json
row abmla
st sync 50 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*PageSize*'
tail -1 $o/sync.log
for kv in auto fp8; do
  st eval_$kv 170 build/kb_nano eval --model llama-3.1-8b-instruct --workload balanced --num-requests 200 --mode graph --max-model-len 4096 --kernel-trace --kv-cache-dtype $kv --json $o/eval_$kv.json
  grep -iE "output tok/s|floor|flash_attn|store_kv|linear|total" $o/eval_$kv.log | head -30
done
st winncu 60 ncu --target-processes all --clock-control none --kernel-name regex:flash_attn_prefill_tma --launch-skip 4 --launch-count 1 --set full --import-source yes -o $o/win build/kb_nano kernels --target flash_attn_prefill --model gpt-oss-20b --tokens 8192 --case 'seqs=1x8192 heads=64 kv=8 D=64 window=128 sinks' --mode hot --seeds 1 --random 0
st winsrc 40 ncu -i $o/win.ncu-rep --page source --print-source sass --csv --log-file $o/win_sass.csv
st winrep 30 build/kb_nano profile --sass-csv $o/win_sass.csv --top 25
head -80 $o/winrep.log
gzip -9 $o/win_sass.csv; rm -f $o/win.ncu-rep; pk
