#!/usr/bin/env bash
# `kb_nano eval --compare-async-scheduling` runs the baseline with synchronous steps and then with async scheduling
# (EngineConfig::async_scheduling) and aligns the two: on the CPU every request is identical. The JSON records the
# setting per run; bad combinations are refused by flag name.
# Usage: eval_async_scheduling_test.sh KB_NANO
set -euo pipefail
kb_nano=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "eval_async_scheduling_test: $*" >&2
  exit 1
}
"$kb_nano" eval --device cpu --num-requests 6 --compare-async-scheduling --json "$dir/e.json" >"$dir/e.log" 2>&1 ||
  { cat "$dir/e.log"; fail "the run failed"; }
log=$(cat "$dir/e.log")
[[ $log == *"baseline+async"* ]] || fail "no baseline+async pass: $log"
[[ $log == *"async scheduling: synchronous steps, then each greedy step"* ]] || fail "no async scheduling line: $log"
[[ $log == *"greedy alignment, baseline+async vs baseline: 6/6 requests identical"* ]] || fail "alignment: $log"
grep -q '"compare_async_scheduling": true' "$dir/e.json" || fail "compare_async_scheduling not in the JSON"
[[ $(grep -c '"async_scheduling": true' "$dir/e.json") -ge 1 ]] || fail "no run with async_scheduling true in the JSON"
[[ $(grep -c '"async_scheduling": false' "$dir/e.json") -ge 2 ]] || fail "the synchronous run and the config's flag"
"$kb_nano" eval --device cpu --num-requests 3 --async-scheduling >"$dir/a.log" 2>&1 || { cat "$dir/a.log"; fail "--async-scheduling failed"; }
refused() {  # wanted text, flags...
  local want=$1 err
  shift
  if err=$("$kb_nano" eval --device cpu "$@" 2>&1); then fail "accepted: $*"; fi
  [[ $err == *"$want"* ]] || fail "$*: expected '$want' in: $err"
}
refused "--async-scheduling: async scheduling needs --tp 1, got --tp 2" --async-scheduling --tp 2
refused "--step-profile times every step alone" --compare-async-scheduling --step-profile
refused "each run the baseline twice" --compare-async-scheduling --nano-batches 2 --compare-nano-batches
refused "drop --async-scheduling" --compare-async-scheduling --async-scheduling
if err=$("$kb_nano" eval --async-scheduling --url http://127.0.0.1:9 2>&1); then fail "accepted --async-scheduling --url"; fi
[[ $err == *"--async-scheduling: with --url the engine is the server's"* ]] || fail "--url: $err"
echo "eval_async_scheduling_test: ok"
