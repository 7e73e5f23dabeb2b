#!/usr/bin/env bash
# Builds kb-nano (CPU-only) with a test candidate folder and checks what a user would see.
#   candidate_build_test.sh SRC_DIR WORK_DIR CASE [MAIN_KB_NANO]
# CASE scaled_rms_norm (L1) / scaled_llama_mlp (L2) / negated_logits (L4): the candidate variant's L4 output
#   differs from the baseline's, which is unchanged, and `kb_nano list --candidates` reports exactly the ops the
#   file changes (those above it) and none beside or below it.
# CASE bad_signature / bad_class / orphan: the build fails with a message naming the file and the problem.
# CASE stubs: `kb_nano stubs` (MAIN_KB_NANO) writes a stub pair per op, refuses to overwrite without --force,
#             and a build with all stubs as candidates generates the same tokens as the baseline.
# CASE hidden: a candidate L3 decoder layer that no longer includes L1/rms_norm.h hides the candidate
#              L1/rms_norm.cu from it, and `kb_nano list --candidates` says so, naming the L3 file.
# CASE cheats: tests/cheats/ (an rms_norm and a linear candidate, behaviour picked by KBN_CHEAT) through `kb_nano
#             kernels --device cpu`: each honest candidate PASSes (the rms_norm one faster than the CPU baseline);
#             each cheat FAILs with the check named in tests/cheats/README.md, and the command exits non-zero.
set -u
src=$1; work=$2; case=$3; main_bin=${4:-}
# NOTE: every case reconfigures one shared build folder with its own candidate folder (the tests hold a ctest
# RESOURCE_LOCK on it), so the baseline variant, engine, bench and CLI compile once for all of them and each case
# compiles only its candidate's include closure. Each case's logs and outputs go to $art.
build="$work/candidate-build"
art="$work/candidate-$case"
rm -rf "$art" && mkdir -p "$art"
cfg() {  # [candidate dir]
  # NOTE: CMAKE_BUILD_TYPE=None (no -O3): these builds exist to check what compiles, swaps and fails, and CI
  # runs nine of them; unoptimised they compile several times faster and the tiny CPU runs stay quick.
  cmake -S "$src" -B "$build" -G Ninja -DKBN_ENABLE_CUDA=OFF -DKBN_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=None \
        -DKBN_CANDIDATE_DIR="${1:-$src/tests/candidates/$case}" >"$art/build.log" 2>&1
}
expect_in() {  # text, pattern; whitespace runs (incl. the line wraps CMake puts in long messages) match any run
  local flat
  flat=$(printf '%s' "$1" | tr -s ' \n\t' '   ')
  if ! grep -qF -- "$(printf '%s' "$2" | tr -s ' \n\t' '   ')" <<<"$flat"; then echo "FAIL: expected '$2' in:"; echo "$1" | tail -40; exit 1; fi
}
case "$case" in
  scaled_rms_norm|scaled_llama_mlp|negated_logits)
    case "$case" in
      scaled_rms_norm) file=L1/rms_norm.cu; affects="rms_norm llama_decoder_layer llama_for_causal_lm"
                       spares="silu_and_mul llama_mlp llama_attention" ;;
      scaled_llama_mlp) file=L2/llama_mlp.cu; affects="llama_mlp llama_decoder_layer llama_for_causal_lm"
                        spares="rms_norm silu_and_mul llama_attention" ;;
      negated_logits) file=L4/llama.cu; affects="llama_for_causal_lm"
                      spares="rms_norm llama_mlp llama_decoder_layer" ;;
    esac
    # scaled_rms_norm builds from a copy of its candidate folder, which the edit-and-rerun check below edits.
    cand_src="$src/tests/candidates/$case"
    if [ "$case" = scaled_rms_norm ]; then
      cand_src="$art-src"
      rm -rf "$cand_src" && cp -r "$src/tests/candidates/$case" "$cand_src"
    fi
    cfg "$cand_src" || { cat "$art/build.log"; exit 1; }
    ninja -C "$build" kb_nano >"$art/build.log" 2>&1 || { tail -40 "$art/build.log"; exit 1; }
    bin="$build/kb_nano"
    args=(generate --model tiny-llama --device cpu --prompt-ids 5,6,7,8 --max-new-tokens 8 --seed 1)
    # Logits, not only tokens: a change deep in the model need not flip a greedy token of a tiny random model.
    base=$("$bin" "${args[@]}" --variant baseline --save-logits "$art/base.safetensors" 2>/dev/null | grep '^prompt')
    cand=$("$bin" "${args[@]}" --variant candidate --save-logits "$art/cand.safetensors" 2>/dev/null | grep '^prompt')
    ref=""
    [ -n "$main_bin" ] && ref=$("$main_bin" "${args[@]}" --save-logits "$art/ref.safetensors" 2>/dev/null | grep '^prompt' || true)
    [ -n "$base" ] && [ -n "$cand" ] || { echo "FAIL: no output"; exit 1; }
    ! cmp -s "$art/base.safetensors" "$art/cand.safetensors" || { echo "FAIL: the candidate did not change L4 logits"; exit 1; }
    if [ -n "$ref" ] && { [ "$ref" != "$base" ] || ! cmp -s "$art/ref.safetensors" "$art/base.safetensors"; }; then
      echo "FAIL: the baseline variant changed in the candidate build"; exit 1
    fi
    line=$("$bin" list --candidates | grep -- "tasks/candidate/$file ->")
    [ -n "$line" ] || { echo "FAIL: list --candidates does not show tasks/candidate/$file"; exit 1; }
    ops=$(sed 's/.*-> //; s/,/ /g' <<<"$line")
    for op in $affects; do grep -qw -- "$op" <<<"$ops" || { echo "FAIL: $file should change $op: $line"; exit 1; }; done
    for op in $spares; do ! grep -qw -- "$op" <<<"$ops" || { echo "FAIL: $file should not change $op: $line"; exit 1; }; done
    if [ "$case" = scaled_rms_norm ]; then
      # Edit and rerun with scripts/kbn: an edit rebuilds only the candidate's dependents; a broken candidate
      # fails the command with the errors about its file first; the fix runs again.
      touch "$cand_src/$file"
      steps=$(ninja -C "$build" -n kb_nano | grep -c '^\[')
      [ "$steps" -le 6 ] || { echo "FAIL: editing $file rebuilds $steps steps:"; ninja -C "$build" -n kb_nano; exit 1; }
      echo 'this line is not C++' >>"$cand_src/$file"
      if out=$(KBN_BUILD_DIR="$build" "$src/scripts/kbn" list --candidates 2>&1); then
        echo "FAIL: scripts/kbn ran with a broken candidate"; exit 1
      fi
      expect_in "$(head -5 <<<"$out")" "==== errors about candidate files ===="
      expect_in "$(head -5 <<<"$out")" "$file"
      cp "$src/tests/candidates/$case/$file" "$cand_src/$file"
      out=$(KBN_BUILD_DIR="$build" "$src/scripts/kbn" list --candidates 2>&1) || { echo "FAIL: scripts/kbn: $out"; exit 1; }
      expect_in "$out" "tasks/candidate/$file ->"
      echo "scripts/kbn: $steps build steps after an edit; broken candidate reported first; fixed candidate runs"
    fi
    if [ "$case" = negated_logits ]; then
      # `kb_nano eval` side by side: negated logits make greedy decoding pick the baseline's last choice, so no
      # request matches, and the baseline's rerun at each first divergence ranks the candidate's token last
      # (never a near-tie), far below its own.
      "$bin" eval --device cpu --num-requests 4 --json "$art/eval.json" >"$art/eval.log" 2>&1 ||
        { echo "FAIL: eval with the candidate"; tail -20 "$art/eval.log"; exit 1; }
      num() { grep -m1 "\"$1\":" "$art/eval.json" | sed -E 's/.*: ([^,]*),?$/\1/'; }
      [ "$(num exact_match)" = 0 ] && [ "$(num scored)" = 4 ] && awk -v r="$(num rank2_fraction)" \
        -v m="$(num median_margin_over_std)" 'BEGIN { exit !(r == 0 && m > 2) }' ||
        { echo "FAIL: eval's divergence scoring of negated logits:"; grep -A8 '"divergences"' "$art/eval.json"; exit 1; }
      expect_in "$(cat "$art/eval.log")" "first divergences as the baseline sees them (4 scored of 4 diverged requests"
      echo "eval: 0/4 identical, divergences ranked last by the baseline (median margin $(num median_margin_over_std) std)"
    fi
    echo "baseline: $base"; echo "candidate: $cand"; echo "$line"; echo "PASS"
    ;;
  cheats)
    cfg "$src/tests/cheats" || { cat "$art/build.log"; exit 1; }
    ninja -C "$build" kb_nano >"$art/build.log" 2>&1 || { tail -40 "$art/build.log"; exit 1; }
    kern() {  # cheat [more args] -> exit status; writes $art/<cheat>.json and .out
      local cheat=$1
      shift
      KBN_CHEAT=$cheat "$build/kb_nano" kernels --device cpu --model tiny-llama --target rms_norm --tokens 5,33 \
        --random 2 --seeds 2 --json "$art/$cheat.json" "$@" >"$art/$cheat.out" 2>&1
    }
    # The honest run includes the composition: the decoder layer built with the candidate rms_norm (2 cases).
    kern honest || { echo "FAIL: the honest candidate did not pass"; cat "$art/honest.out"; exit 1; }
    expect_in "$(cat "$art/honest.out")" "6 of 6 cases pass"
    expect_in "$(cat "$art/honest.out")" "in the blocks that include it"
    # Timing on a shared 2-core machine is noise at the honest candidate's margin (it measured 0.93x once under
    # ctest -j2), so its speedup is only required to be a positive number; the timing's direction is checked
    # with `slow`, a correct candidate that waits ~2 ms per call (hundreds of times the op): it must PASS and be
    # reported far slower.
    geomean() { grep -o '"geomean_speedup": [0-9.e+-]*' "$1" | awk '{print $2}'; }
    speedup=$(geomean "$art/honest.json")
    awk -v s="$speedup" 'BEGIN { exit !(s > 0) }' || { echo "FAIL: honest candidate's speedup '$speedup'"; exit 1; }
    KBN_CHEAT=slow "$build/kb_nano" kernels --device cpu --model tiny-llama --target rms_norm --tokens 5 --random 0 \
      --seeds 1 --no-composition --json "$art/slow.json" >"$art/slow.out" 2>&1 ||
      { echo "FAIL: the slow (correct) candidate did not pass"; cat "$art/slow.out"; exit 1; }
    slow=$(geomean "$art/slow.json")
    awk -v s="$slow" 'BEGIN { exit !(s > 0 && s < 0.5) }' ||
      { echo "FAIL: a candidate 2 ms slower per call reported a speedup of '$slow'"; cat "$art/slow.out"; exit 1; }
    echo "honest: ${speedup}x; slow: ${slow}x"
    failed_as() {  # name, json, out, wanted checks (ERE): the checks of the failing rows are all wanted ones
      local checks
      checks=$(grep -o '"check": "[a-z ]*"' "$2" 2>/dev/null | sed 's/"check": //; s/"//g' | grep -v '^$' | sort -u)
      [ -n "$checks" ] || { echo "FAIL: cheat '$1' failed without a validation check"; cat "$3"; exit 1; }
      if grep -qvxE "$4" <<<"$checks"; then
        echo "FAIL: cheat '$1' should fail '$4', failed: $checks"; cat "$3"; exit 1
      fi
      echo "$1: FAIL as expected ($(tr '\n' ',' <<<"$checks" | sed 's/,$//'))"
    }
    for spec in cached_output:"fresh output" side_stream:unwritten zero_skip:tolerance shape_specialised:tolerance \
                stale_output:"fresh output" low_precision:"tolerance|precision" partial_write:unwritten \
                mutate_input:immutable; do
      cheat=${spec%%:*}; want=${spec#*:}
      if kern "$cheat" --no-composition; then echo "FAIL: cheat '$cheat' passed"; cat "$art/$cheat.out"; exit 1; fi
      failed_as "$cheat" "$art/$cheat.json" "$art/$cheat.out" "$want"
    done
    # The shape-specialised cheat is right on every config shape and wrong on random odd ones.
    [ "$(grep -c '"verdict": "PASS"' "$art/shape_specialised.json")" = 2 ] ||
      { echo "FAIL: shape_specialised should pass exactly the 2 config shapes"; exit 1; }
    # The linear cheats (tests/cheats/L1/linear.cu). Each case's candidate runs in a worker process that must
    # answer within --worker-timeout: hang costs that long per case, so it runs the five T=5 cases with 3 s.
    kern_linear() {  # cheat -> exit status; writes $art/linear-<cheat>.json and .out
      local tokens=5,33 random=1 limit=10
      [ "$1" = hang ] && tokens=5 random=0 limit=3
      KBN_CHEAT=$1 "$build/kb_nano" kernels --device cpu --model tiny-llama --target linear --tokens $tokens \
        --random $random --seeds 2 --no-composition --worker-timeout $limit --json "$art/linear-$1.json" \
        >"$art/linear-$1.out" 2>&1
    }
    kern_linear honest || { echo "FAIL: the honest linear candidate did not pass"; cat "$art/linear-honest.out"; exit 1; }
    rows=$(grep -c '"verdict":' "$art/linear-honest.json")
    passed=$(grep -c '"verdict": "PASS"' "$art/linear-honest.json")
    [ "$rows" -gt 0 ] && [ "$passed" = "$rows" ] ||
      { echo "FAIL: the honest linear candidate passed $passed of $rows cases"; cat "$art/linear-honest.out"; exit 1; }
    echo "linear honest: $passed of $rows cases pass"
    for spec in address_cache:"timed outputs|tolerance|fresh output" peek_baseline:"unwritten|tolerance" \
                prefetch_next:"timed outputs|tolerance|fresh output" exit_zero:worker hang:worker; do
      cheat=${spec%%:*}; want=${spec#*:}
      if kern_linear "$cheat"; then echo "FAIL: linear cheat '$cheat' passed"; cat "$art/linear-$cheat.out"; exit 1; fi
      failed_as "linear $cheat" "$art/linear-$cheat.json" "$art/linear-$cheat.out" "$want"
    done
    echo "PASS"
    ;;
  bad_signature|bad_class)
    cfg || { cat "$art/build.log"; exit 1; }
    out=$(ninja -C "$build" CMakeFiles/kbn_tasks_candidate.dir/tasks/ops/L1/rms_norm.cpp.o 2>&1) && { echo "FAIL: built"; exit 1; }
    expect_in "$out" "tasks/candidate/L1/rms_norm.h"
    if [ "$case" = bad_signature ]; then expect_in "$out" "must declare \`Tensor forward(const Tensor&)\`"
    else expect_in "$out" "class 'RMSNorm' is missing"; fi
    echo "PASS"
    ;;
  orphan)
    if cfg; then echo "FAIL: configured"; exit 1; fi
    out=$(cat "$art/build.log")
    expect_in "$out" "has no baseline twin"
    expect_in "$out" "L1/fast_gelu.h"
    echo "PASS"
    ;;
  stubs)
    [ -n "$main_bin" ] || { echo "FAIL: the stubs case needs the main build's kb_nano as argument 4"; exit 1; }
    stubs_dir="$work/stub-cands"
    rm -rf "$stubs_dir"
    stubs() { KBN_SOURCE_DIR="$src" "$main_bin" stubs --dir "$stubs_dir" "$@" 2>&1; }
    out=$(stubs) || { echo "FAIL: kb_nano stubs failed:"; echo "$out"; exit 1; }
    expect_in "$out" "wrote   L1/rms_norm.h"
    expect_in "$out" "wrote   L4/llama.cu"
    expect_in "$out" "0 skipped"
    for f in $(cd "$src/tasks/baseline" && ls L*/*.h L*/*.cu); do
      [ -f "$stubs_dir/$f" ] || { echo "FAIL: no stub $f"; exit 1; }
    done
    [ "$(grep -c '^#include "L1/rms_norm.h"' "$stubs_dir/L1/rms_norm.cu")" = 1 ] || { echo "FAIL: rms_norm.cu written twice?"; exit 1; }
    expect_in "$(cat "$stubs_dir/L1/rms_norm.cu")" "// >>> YOUR KERNEL HERE: RMSNorm::forward"
    expect_in "$(cat "$stubs_dir/L1/rms_norm.h")" "Replaces tasks/baseline/L1/rms_norm.h in the candidate variant"
    expect_in "$(cat "$stubs_dir/L1/rms_norm.h")" "RMSNorm(int64_t hidden_size, double eps = 1e-6, const ParamOptions& opts = {});"
    expect_in "$(cat "$stubs_dir/L1/rms_norm.h")" "std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual);"
    expect_in "$(cat "$stubs_dir/L1/rms_norm.h")" "Ops: rms_norm (RMSNorm), fused_add_rms_norm (RMSNorm)"
    echo "// edited by the user" >>"$stubs_dir/L1/rms_norm.cu"
    out=$(stubs) || { echo "FAIL: second kb_nano stubs failed:"; echo "$out"; exit 1; }
    expect_in "$out" "skipped L1/rms_norm.cu (exists; --force overwrites it)"
    expect_in "$out" "0 written"
    expect_in "$(tail -1 "$stubs_dir/L1/rms_norm.cu")" "edited by the user"
    out=$(stubs --target rms_norm --force) || { echo "FAIL: stubs --force failed:"; echo "$out"; exit 1; }
    expect_in "$out" "2 written, 0 skipped"
    if grep -q "edited by the user" "$stubs_dir/L1/rms_norm.cu"; then echo "FAIL: --force did not overwrite"; exit 1; fi
    out=$(stubs --target rmsnorm) && { echo "FAIL: accepted an unknown op"; exit 1; }
    expect_in "$out" "--target: unknown op 'rmsnorm'; known: "
    expect_in "$out" "rms_norm, fused_add_rms_norm"
    out=$(stubs --architecture NoSuchForCausalLM) && { echo "FAIL: accepted an unknown architecture"; exit 1; }
    expect_in "$out" "--architecture: 'NoSuchForCausalLM' is neither"
    cfg "$stubs_dir" || { cat "$art/build.log"; exit 1; }
    ninja -C "$build" kb_nano >"$art/build.log" 2>&1 || { tail -40 "$art/build.log"; exit 1; }
    bin="$build/kb_nano"
    args=(generate --model tiny-llama --device cpu --prompt-ids 5,6,7 --max-new-tokens 4)
    base=$("$bin" "${args[@]}" --variant baseline 2>/dev/null | grep '^prompt')
    cand=$("$bin" "${args[@]}" --variant candidate 2>/dev/null | grep '^prompt')
    [ -n "$base" ] && [ -n "$cand" ] || { echo "FAIL: no output"; exit 1; }
    [ "$base" = "$cand" ] || { echo "FAIL: stubs changed the output: baseline $base, candidate $cand"; exit 1; }
    listing=$("$bin" list --candidates)
    expect_in "$listing" "tasks/candidate/L1/rms_norm.cu -> rms_norm, fused_add_rms_norm"
    expect_in "$listing" "tasks/candidate/L4/llama.h"
    echo "tokens: $cand"; echo "PASS"
    ;;
  hidden)
    cfg || { cat "$art/build.log"; exit 1; }
    ninja -C "$build" kb_nano >"$art/build.log" 2>&1 || { tail -40 "$art/build.log"; exit 1; }
    listing=$("$build/kb_nano" list --candidates)
    rms=$(grep -A4 '^  tasks/candidate/L1/rms_norm.cu' <<<"$listing")
    expect_in "$rms" "hidden from llama_decoder_layer (L3) by tasks/candidate/L3/llama_decoder_layer.h"
    # L4/llama.h still includes L1/rms_norm.h for the final norm, so the model still runs the candidate.
    expect_in "$rms" "reaches L4: llama_for_causal_lm"
    if grep -q "hidden" <<<"$(grep -A4 '^  tasks/candidate/L3/' <<<"$listing")"; then
      echo "FAIL: the L3 candidate reported hidden:"; echo "$listing"; exit 1
    fi
    expect_in "$("$build/kb_nano" list --json)" '"candidate_hidden"'
    echo "$listing"; echo "PASS"
    ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
