#!/usr/bin/env bash
# session 23, call 3: the whole GPU test suite on 77f3ee5 (fp8 KV scales, the 8-wide fp8 store, the transposed
# prefill epilogue), JSON per test.
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
s=$SECONDS; timeout -k 5 380 build/tests/kbn_gpu_tests --gtest_output=json:$o/gpu_tests.json > $o/tests.log 2>&1
echo "rc=$? $((SECONDS-s))s" | tee $o/status.txt
grep -hE "^\[  (PASSED|FAILED) |tests ran|^\[  FAILED" $o/tests.log | head -20; tail -3 $o/tests.log
(cd $OUT && tar czf s.tgz s)
