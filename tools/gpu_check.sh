#!/usr/bin/env bash
# Runs on the GPU machine from the repo root with a build carried in build/: the GPU tests, the CPU tests, and
# the main job (Llama-3.1-8B-Instruct, seeded random bf16 weights). Logs go to $OUT (or ./out).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
export KBN_FIXTURE_DIR=$PWD/tests/fixtures KBN_MODELS_DIR=$PWD/models
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
build/tests/kbn_gpu_tests --gtest_output=json:"$out/gpu_tests.json" "$@" 2>&1 | tee "$out/gpu_tests.log" | grep -vE '^\[ +(RUN|OK) ' | tail -60
build/tests/kbn_tests --gtest_brief=1 2>&1 | tail -3
build/kb_nano generate --max-new-tokens 64 --json "$out/generate_8b.json" 2>&1 | tee "$out/generate_8b.log"
