#!/usr/bin/env bash
# Session 28, call D (the device time left): the fused ops' GPU tests after call C's findings (f32 rotations now
# rounded product by product in all three rotating kernels; the tests' own mistakes fixed), the rotary and store
# tests, the engine's graph tests and the tiny models' op contracts of the rotating ops.
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/gpu.txt
timeout -k 5 90 build/tests/kbn_gpu_tests --gtest_filter='FusedRopeKVCacheGpu.*:FusedQKNormRopeGpu.*:RotaryEmbeddingGpu.*:StoreKVCacheGpu.*:EngineGraphGpu.*:*tiny*fused_rope_kvcache*:*tiny*rotary_embedding*:*tiny*fused_qk_norm_rope*' --gtest_output=json:$O/tests.json > $O/tests.log 2>&1
echo "tests rc=$?" > $O/status.txt
timeout -k 5 45 build/kb_nano kernels --variant baseline --no-composition --random 0 --seeds 1 --model llama-3.1-8b-instruct --target fused_rope_kvcache --target rotary_embedding --target store_kvcache --tokens 1,64 --json $O/fused.json > $O/fused.log 2>&1
echo "fused rc=$?" >> $O/status.txt
cat $O/status.txt; grep -E "^\[  (PASSED|FAILED) |tests ran|Failure|vs |fused" $O/tests.log | head -40; grep -E "T=" $O/fused.log | tail -8
