#!/usr/bin/env bash
# session 21, call 3: fp8 pages landing in place (head 128) on the TMA prefill kernel: tests, sanitizers, fp8 (TMA,
# baseline) vs fp8 (mma.sync, candidate = 356ee5d^) vs 16-bit pages; mla_decode lagged P V (candidate) vs HEAD
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st tests 90 build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*Fp8*:FlashAttnFeaturesGpu.Gpt*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st sync 60 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.Fp8PagesHopper*'
tail -1 $o/sync.log
st race 40 compute-sanitizer --tool racecheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.Fp8PagesOnTensorCores'
tail -1 $o/race.log
st ab_fp8 100 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 4096,8192,16384 --kv-cache-dtype fp8 --json $o/ab_fp8.json --markdown $o/ab_fp8.md
grep -hE "Summary" $o/ab_fp8.log
st bf16 45 build/kb_nano kernels --random 0 --seeds 1 --target flash_attn_prefill --model llama-3.1-8b-instruct --tokens 4096,8192,16384 --json $o/bf16.json
grep -hE "Summary" $o/bf16.log
st ab_mla 70 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --model deepseek-v3 --target mla_decode --tokens 32,64,128 --json $o/ab_mla.json --markdown $o/ab_mla.md
grep -hE "Summary" $o/ab_mla.log
