#!/usr/bin/env bash
# Builds kb-nano (CPU-only) with a test candidate folder and checks what a user would see.
#   candidate_build_test.sh SRC_DIR WORK_DIR CASE [MAIN_KB_NANO]
# CASE scaled_rms_norm: the candidate variant's L4 output differs from the baseline's, which is unchanged,
#                       and `kb_nano list --candidates` reports the ops the file changes.
# CASE bad_signature / bad_class / orphan: the build fails with a message naming the file and the problem.
set -u
src=$1; work=$2; case=$3; main_bin=${4:-}
build="$work/candidate-$case"
rm -rf "$build"
cfg() { cmake -S "$src" -B "$build" -G Ninja -DKBN_ENABLE_CUDA=OFF -DKBN_BUILD_TESTS=OFF \
          -DKBN_CANDIDATE_DIR="$src/tests/candidates/$case" >"$build.log" 2>&1; }
expect_in() {  # text, pattern
  if ! grep -q -- "$2" <<<"$1"; then echo "FAIL: expected '$2' in:"; echo "$1" | tail -40; exit 1; fi
}
case "$case" in
  scaled_rms_norm)
    cfg || { cat "$build.log"; exit 1; }
    ninja -C "$build" kb_nano >"$build.log" 2>&1 || { tail -40 "$build.log"; exit 1; }
    bin="$build/kb_nano"
    args=(generate --model tiny-llama --device cpu --prompt-ids 5,6,7,8 --max-new-tokens 8 --seed 1)
    base=$("$bin" "${args[@]}" --variant baseline 2>/dev/null | grep '^prompt')
    cand=$("$bin" "${args[@]}" --variant candidate 2>/dev/null | grep '^prompt')
    ref=""
    [ -n "$main_bin" ] && ref=$("$main_bin" "${args[@]}" 2>/dev/null | grep '^prompt' || true)
    [ -n "$base" ] && [ -n "$cand" ] || { echo "FAIL: no output"; exit 1; }
    [ "$base" != "$cand" ] || { echo "FAIL: the candidate did not change L4 output: $cand"; exit 1; }
    if [ -n "$ref" ] && [ "$ref" != "$base" ]; then echo "FAIL: baseline changed by the candidate build"; exit 1; fi
    listing=$("$bin" list --candidates)
    expect_in "$listing" "tasks/candidate/L1/rms_norm.cu"
    expect_in "$listing" "llama_for_causal_lm"
    expect_in "$listing" "llama_decoder_layer"
    echo "baseline: $base"; echo "candidate: $cand"; echo "PASS"
    ;;
  bad_signature|bad_class)
    cfg || { cat "$build.log"; exit 1; }
    out=$(ninja -C "$build" CMakeFiles/kbn_tasks_candidate.dir/tasks/registry.cpp.o 2>&1) && { echo "FAIL: built"; exit 1; }
    expect_in "$out" "tasks/candidate/L1/rms_norm.h"
    if [ "$case" = bad_signature ]; then expect_in "$out" "must declare \`Tensor forward(const Tensor&)\`"
    else expect_in "$out" "class 'RMSNorm' is missing"; fi
    echo "PASS"
    ;;
  orphan)
    if cfg; then echo "FAIL: configured"; exit 1; fi
    out=$(cat "$build.log")
    expect_in "$out" "has no baseline twin"
    expect_in "$out" "L1/fast_gelu.h"
    echo "PASS"
    ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
