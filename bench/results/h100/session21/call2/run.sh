#!/usr/bin/env bash
# session 21, call 2: fp8 pages on the TMA prefill kernel (tests, kernels fp8 vs bf16 pages), remaining attention GPU tests
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st tests 120 build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st fp8 100 build/kb_nano kernels --random 0 --seeds 1 --target flash_attn_prefill --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 1024,4096,8192,16384 --kv-cache-dtype fp8 --json $o/fp8.json --markdown $o/fp8.md
grep -hE "^\| |cases pass|FAIL|ERROR" $o/fp8.log | cut -d'|' -f2-9 | head -30
st bf16 100 build/kb_nano kernels --random 0 --seeds 1 --target flash_attn_prefill --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 1024,4096,8192,16384 --json $o/bf16.json --markdown $o/bf16.md
grep -hE "^\| |cases pass|FAIL|ERROR" $o/bf16.log | cut -d'|' -f2-9 | head -30
st rnd8 60 build/kb_nano kernels --random 4 --seeds 2 --target flash_attn_prefill --model llama-3.1-8b-instruct --model gpt-oss-20b --tokens 2048 --kv-cache-dtype fp8 --json $o/rnd8.json
grep -hE "cases pass|FAIL|ERROR" $o/rnd8.log | head
st sync 60 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.Fp8PagesHopper*'
tail -2 $o/sync.log
st race 90 compute-sanitizer --tool racecheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.Fp8PagesOnTensorCores'
tail -2 $o/race.log
st ops 150 build/tests/kbn_gpu_tests --gtest_filter='*OpContractGpu*flash_attn*:*OpContractGpu*gemma*:*OpContractGpu*gpt_oss*'
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/ops.log; grep -B2 -A10 "Failure" $o/ops.log | head -20
