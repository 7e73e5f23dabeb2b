#!/usr/bin/env bash
# kb_nano serve measured by kb_nano eval --url on the GPU machine, beside the same workload in-process (one device
# call; what bench/results/h200/serve/ holds). Run from the repo root with build/kb_nano and build/lib carried (cpp-httplib
# and brotli, found through the binary's RPATH $ORIGIN/lib), and a tokenizer.json for the model (for Llama-3.1-8B with
# random weights: tools/tokenizer_fixture.py --full --gguf <llama.cpp>/models/ggml-vocab-llama-bpe.gguf --out DIR
# writes the whole Llama-3 vocabulary, 7 MB; gzip it to carry).
#
# Usage: tools/serve_bench.sh --tokenizer FILE[.gz] [--model llama-3.1-8b-instruct] [--kb-nano build/kb_nano]
#                             [--port 8011] [--out DIR]
# Runs: serve (graph mode, max_model_len 4096, max_num_batched_tokens 16384); a chat completion; eval --url at batch 1
# (16 x 128/128, one at a time), Poisson 20 req/s and all at once (200 x 1024/128 each); then, with the server
# stopped, eval of the same 200 requests in-process (max_num_seqs 256, optimistic admission, as the server). Every
# output lands in --out (default $OUT/serve, else ./serve_bench), packed as serve.tgz beside it.
set -uo pipefail
die() { echo "serve_bench: $*" >&2; exit 2; }
model=llama-3.1-8b-instruct kb=build/kb_nano port=8011 tok="" out="${OUT:-.}/serve"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tokenizer) tok=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --kb-nano) kb=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -n $tok && -f $tok ]] || die "--tokenizer: a tokenizer.json (or .gz) is needed, got '$tok'"
[[ -x $kb ]] || die "kb_nano not found or not executable: $kb (carry build/kb_nano and build/lib)"
mkdir -p "$out" || die "cannot create $out"
export KBN_MODELS_DIR=${KBN_MODELS_DIR:-$PWD/models}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [[ $tok == *.gz ]]; then gunzip -c "$tok" > "$out/tokenizer.json" || die "cannot unpack $tok"; tok=$out/tokenizer.json; fi
t0=$(date +%s); step() { echo "=== $1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > "$out/gpu.txt"
ldd "$kb" | grep -E "not found|httplib|brotli|ssl" > "$out/ldd.txt"
grep -q "not found" "$out/ldd.txt" && die "kb_nano misses libraries: $(cat "$out/ldd.txt")"
"$kb" --version > "$out/version.txt" 2>&1
step serve
"$kb" serve --model "$model" --tokenizer "$tok" --port "$port" --max-model-len 4096 --max-num-batched-tokens 16384 \
  > "$out/serve.out" 2> "$out/serve.log" &
sp=$!
for _ in $(seq 1 480); do grep -q "listening on" "$out/serve.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.5; done
grep -q "listening on" "$out/serve.log" || { cat "$out/serve.log"; kill $sp 2>/dev/null; die "the server did not start"; }
u=http://127.0.0.1:$port
curl -s "$u/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Name three GPUs."}],"max_tokens":16,"temperature":0}' \
  > "$out/chat.json"
run() {  # name, then eval --url flags
  local name=$1; shift
  step "$name"
  timeout 150 "$kb" eval --url "$u" "$@" --json "$out/$name.json" > "$out/$name.txt" 2>&1
  grep -E "Successful|Failed|duration|Output token|Median TTFT|P99 TTFT|Median TPOT|Median ITL" "$out/$name.txt"
}
run url_b1 --input-len 128 --output-len 128 --num-prompts 16 --max-concurrency 1
run url_rate20 --input-len 1024 --output-len 128 --num-prompts 200 --request-rate 20 --seed 1
run url_inf --input-len 1024 --output-len 128 --num-prompts 200 --seed 1
kill -TERM $sp; wait $sp; echo "serve exited $?"
step inproc
timeout 150 "$kb" eval --model "$model" --mode graph --input-len 1024 --output-len 128 --num-prompts 200 --seed 1 \
  --max-model-len 4096 --max-num-seqs 256 --admission optimistic --json "$out/inproc_inf.json" > "$out/inproc_inf.txt" 2>&1
grep -E "duration|output tokens/s|TTFT|TPOT|floor" "$out/inproc_inf.txt"
step done
rm -f "$out/tokenizer.json"
tar czf "$(dirname "$out")/serve.tgz" -C "$(dirname "$out")" "$(basename "$out")"
