#!/usr/bin/env bash
# Session 24, call 4: the whole GPU suite on this session's binary (warm machine; call 3 ran the new tests).
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
t0=$(date +%s); timeout 370 build/tests/kbn_gpu_tests --gtest_brief=1 > $O/tests.log 2>&1; echo "suite rc=$? $(( $(date +%s) - t0 ))s" > $O/status.txt
cat $O/status.txt; grep -E "FAILED|PASSED|tests ran" $O/tests.log | tail -15
cd $OUT && gzip -9 s/tests.log && tar czf s.tgz s && rm -rf s
