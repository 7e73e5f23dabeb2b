#!/usr/bin/env bash
# Session 30, call B: the async-scheduling GPU test of the tiny DeepSeek-V2 faulted (illegal address) in call A; run it
# alone under compute-sanitizer (which kernel, launched from where), and the tiny Mamba-2 case alone.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" >> $O/status.txt; }
st mamba2 60 build/tests/kbn_gpu_tests --gtest_filter='*AsyncSchedulingGpu*mamba2*'
st deepseek 60 build/tests/kbn_gpu_tests --gtest_filter='*AsyncSchedulingGpu*deepseek*'
st sanitizer 240 compute-sanitizer --tool memcheck --show-backtrace host --print-limit 4 build/tests/kbn_gpu_tests --gtest_filter='*AsyncSchedulingGpu*deepseek*'
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |Failure|exception" $O/mamba2.log $O/deepseek.log | head
grep -E "Invalid|at 0x|by thread|Host Frame|=========" $O/sanitizer.log | head -60
cd $OUT && tar czf s.tgz s && rm -rf s
