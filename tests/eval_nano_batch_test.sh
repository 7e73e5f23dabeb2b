#!/usr/bin/env bash
# `kb_nano eval --compare-nano-batches` runs the baseline with whole steps and then with overlapped nano-batches
# (engine/nano_batch.h), reports how many steps ran split, and aligns the two: on the CPU every request is identical.
# The JSON records the settings; bad combinations are refused by flag name.
# Usage: eval_nano_batch_test.sh KB_NANO
set -euo pipefail
kb_nano=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "eval_nano_batch_test: $*" >&2
  exit 1
}
"$kb_nano" eval --device cpu --num-requests 6 --nano-batches 3 --nano-batch-min-tokens 2 --nano-batch-split kind \
  --nano-batch-stagger --compare-nano-batches \
  --json "$dir/e.json" >"$dir/e.log" 2>&1 || { cat "$dir/e.log"; fail "the run failed"; }
log=$(cat "$dir/e.log")
[[ $log == *"baseline+nano-3"* ]] || fail "no baseline+nano-3 pass: $log"
line=$(grep '^nano-batched steps / steps' "$dir/e.log") || fail "no nano-batched steps row: $log"
[[ $line =~ off[[:space:]]+([0-9]+)\ /\ ([0-9]+)\ \(3\ each\) ]] || fail "nano-batched steps row: $line"
split=${BASH_REMATCH[1]} steps=${BASH_REMATCH[2]}
((split > 0 && split <= steps)) || fail "$split of $steps steps split"
[[ $log == *"greedy alignment, baseline+nano-3 vs baseline: 6/6 requests identical"* ]] || fail "alignment: $log"
grep -q '"nano_batch_min_tokens": 2' "$dir/e.json" || fail "nano_batch_min_tokens not in the JSON"
grep -q '"nano_batch_split": "kind"' "$dir/e.json" || fail "nano_batch_split not in the JSON"
grep -q '"nano_batch_stagger": true' "$dir/e.json" || fail "nano_batch_stagger not in the JSON"
[[ $log == *"staggered (each starts at the previous one's first attention)"* ]] || fail "no stagger line: $log"
grep -q '"nano_batched_steps": '"$split" "$dir/e.json" || fail "nano_batched_steps $split not in the JSON"
refused() {  # wanted text, flags...
  local want=$1 err
  shift
  if err=$("$kb_nano" eval --device cpu "$@" 2>&1); then fail "accepted: $*"; fi
  [[ $err == *"$want"* ]] || fail "$*: expected '$want' in: $err"
}
refused "--nano-batches 2: overlapped nano-batches need --tp 1" --nano-batches 2 --tp 2
refused "nano-batches per step must be 1 (off) .. 8, got 9" --nano-batches 9
refused "--nano-batch-gemm-sms" --nano-batches 2 --nano-batch-gemm-sms -3
refused "--nano-batch-split: expected balanced or kind, got 'even'" --nano-batches 2 --nano-batch-split even
refused "give --nano-batches N (N >= 2) with them" --nano-batch-stagger
refused "give --nano-batches N (N >= 2) with them" --nano-batch-split kind
refused "--compare-nano-batches: compares --nano-batches N (N >= 2) with whole steps" --compare-nano-batches
refused "each run the baseline twice" --nano-batches 2 --compare-nano-batches --compare-kv-cache-dtype \
  --kv-cache-dtype fp8
echo "eval_nano_batch_test: ok ($split of $steps steps split into 3)"
