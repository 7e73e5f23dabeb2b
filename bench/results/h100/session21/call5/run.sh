#!/usr/bin/env bash
# session 21, call 5: head 64 with two Q buffers (the next item's Q copied at the start of the current one) and its
# rows' sinks loaded at the item's start (baseline) vs 40e1e00 (candidate): tests, sanitizers, gpt-oss prefill A/B
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st ab 90 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --tokens 1024,4096,8192 --json $o/ab_gptoss.json --markdown $o/ab_gptoss.md
grep -hE "Summary" $o/ab.log
st tests 100 build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st sync 40 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnFeaturesGpu.GptOssLikeWindowAndSinks'
tail -1 $o/sync.log
st race 40 compute-sanitizer --tool racecheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnFeaturesGpu.GptOssLikeWindowAndSinks'
tail -1 $o/race.log
st ab8 50 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --tokens 8192 --kv-cache-dtype fp8 --json $o/ab_gptoss_fp8.json
grep -hE "Summary" $o/ab8.log
