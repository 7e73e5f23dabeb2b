#!/usr/bin/env bash
# `kb_nano eval` wires its admission and prefix-caching flags into the engine. On a KV cache too small for the
# CPU default workload, vLLM's optimistic admission (--admission optimistic, prefix caching on) preempts and finds
# preempted requests' own blocks in the prefix cache; the default (--admission reserve) with --no-prefix-caching
# preempts nothing and finds nothing; both runs produce every output token. A wrong --admission is refused by name.
# A CPU run reports no serial floor (n/a), in its output and its JSON.
# Usage: eval_admission_test.sh KB_NANO
set -euo pipefail
kb_nano=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {  # name, flags...
  local name=$1
  shift
  "$kb_nano" eval --device cpu --num-kv-blocks 40 --variant baseline --json "$dir/$name.json" "$@" >"$dir/$name.log"
}
field() {  # file, key: the first value of "key" in the JSON file
  grep -m1 "\"$2\":" "$1" | sed -E 's/.*: ([^,]*),?$/\1/'
}
expect() {  # what, got, test
  if ! eval "$3"; then
    echo "eval_admission_test: $1: got '$2'" >&2
    exit 1
  fi
}
run optimistic --admission optimistic
run reserve --no-prefix-caching
d=$dir/optimistic.json r=$dir/reserve.json
v=$(field "$d" preemptions);             expect "optimistic run preempts" "$v" '[[ $v -gt 0 ]]'
v=$(field "$d" prefix_cache_hit_tokens); expect "optimistic run finds cached blocks" "$v" '[[ $v -gt 0 ]]'
v=$(field "$r" preemptions);             expect "reserving run preempts nothing" "$v" '[[ $v -eq 0 ]]'
v=$(field "$r" prefix_cache_hit_tokens); expect "run without prefix caching finds nothing" "$v" '[[ $v -eq 0 ]]'
v=$(field "$r" admission);               expect "reserve admission recorded" "$v" '[[ $v == \"reserve\" ]]'
v=$(field "$d" admission);               expect "optimistic admission recorded" "$v" '[[ $v == \"optimistic\" ]]'
v=$(field "$r" prefix_caching);          expect "prefix_caching recorded" "$v" '[[ $v == false ]]'
# A CPU run has no serial floor, says so, and writes why into the JSON.
v=$(field "$r" available);               expect "CPU run: serial floor unavailable" "$v" '[[ $v == false ]]'
v=$(grep -c '^serial floor: n/a (CPU run' "$dir/reserve.log" || true)
expect "CPU run prints that there is no serial floor" "$v" '[[ $v -eq 1 ]]'
a=$(field "$d" output_tokens) b=$(field "$r" output_tokens)
expect "the same output tokens ($a)" "$b" '[[ $a -gt 0 && $a == "$b" ]]'
if err=$("$kb_nano" eval --device cpu --admission sometimes 2>&1); then
  echo "eval_admission_test: --admission sometimes was accepted" >&2
  exit 1
fi
expect "--admission sometimes refused by name" "$err" '[[ $err == *"--admission"*"reserve or optimistic"* ]]'
echo "eval_admission_test: ok (optimistic: $(field "$d" preemptions) preemptions, $(field "$d" prefix_cache_hit_tokens) cached tokens)"
