#!/usr/bin/env bash
# llama.cpp side by side with kb_nano in one call on the GPU machine (issue 20, item 5).
#
# Needs, from the repo root: the tarball of tools/llama_cpp_fetch.sh (default build-llamacpp/llama.cpp-src.tar.gz,
# made on the development machine: the GPU machine has no network) and build/kb_nano (a CUDA build). The device call
# carries them (carry: build-llamacpp/llama.cpp-src.tar.gz, build/kb_nano and build/lib, the cpp-httplib and brotli
# libraries kb_nano finds beside it through RPATH $ORIGIN/lib; about 21 MiB together).
#
# Usage:  tools/llama_cpp_peer.sh [--cpu-smoke] [--tarball FILE] [--kb-nano FILE] [--config models/X.json]
#                                 [--dtype f16|bf16] [--work DIR] [--skip-kb-nano]
# What it does (GPU mode, the default), each step under a time limit, its exit status and seconds in status.txt, a
# failed step never stopping the run (steps that need its output are skipped and say why):
#   1. provenance: nvidia-smi (GPU, driver, CUDA, clocks, power limit), nvcc --version, the kb-nano commit, the
#      llama.cpp tag/commit (LLAMA_CPP_SOURCE.json in the tarball); the SM clock, power and throttle reasons every
#      200 ms for the whole run (smi.csv)
#   2. untar into --work (default /tmp/kbn_llama_cpp), configure with -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#      (Release, no tests/examples/server), build llama-bench and llama-batched-bench with -j$LLAMA_JOBS (16)
#   3. at the same time (CPU work beside the build): the GGUF, tools/llama_cpp_gguf.py with that source's gguf-py:
#      --config's shapes (default models/llama-3.1-8b-instruct.json), random F16 weights (--dtype bf16 for BF16),
#      the Llama-3 tokenizer of models/ggml-vocab-llama-bpe.gguf
#   4. kb_nano, graph mode, random bf16 weights: eval latency-b1 (16 x 128/128 at batch 1: TPOT), the 4096-token
#      prefill (latency-b1 --scale 32: $PREFILL_REQUESTS (2) requests of 4096/4096 one at a time: TTFT), and
#      256 x 512/512 in one wave (latency-b32 --scale 4 --num-requests 256 --max-num-seqs 256: duration)
#   5. llama.cpp, every layer on the GPU (-ngl 99), flash attention ON (-fa 1): llama-bench -p 512,4096 -n 128
#      -ub 512,2048 -r 5 (its default ubatch 512 and a 2048 one), then llama-batched-bench -npp 512 -ntg 512 -npl 256
#      -c 262144 (256 x 1024 cells: every sequence fits; -b 2048 -ub 512, llama.cpp's defaults)
#   6. tools/llama_cpp_peer_report.py: $OUT/llama_peer.md (table + provenance + commands) and $OUT/llama_peer.json
# Out: four files in $OUT (the device returns at most 8): llama_peer.tar.gz (the run folder llama_peer/: every log,
# the raw JSON, status.txt, smi.csv, provenance; moved to --work once packed), llama_peer.md, llama_peer.json and
# llama_peer_status.txt. The whole run keeps within $TOTAL_S seconds (default 540: the device allows 600 per call):
# each step's limit is cut to what is left, and a step with no time left is skipped and recorded so. Elapsed time
# per step is printed as it finishes.
#
# --cpu-smoke: for the development machine (no GPU, no CUDA): builds llama.cpp with -DGGML_CUDA=OFF (-j$LLAMA_JOBS,
# default 1, under nice -n 19), writes the GGUF of a tiny config (default models/tiny-llama.json, whose vocab is
# widened to the tokenizer's 128256), runs llama-bench (-p 64 -n 16 -r 2 -ngl 0) and llama-batched-bench
# (-npp 32 -ntg 16 -npl 4 -c 512) on the CPU with $LLAMA_THREADS (1) threads, kb_nano eval on the CPU with
# tiny-llama (2 requests, only to exercise the report; not a measurement), and the report. It runs no CUDA and no
# kb_nano GPU run; the default --work is /tmp/kbn_llama_cpp_smoke and a build there is reused (ninja rebuilds nothing
# when the source is unchanged).
#
# Environment: OUT (default out), PYTHON (python3), LLAMA_JOBS, TOTAL_S, PREFILL_REQUESTS, KEEP_GGUF=1 (keep the
# GGUF in --work), LLAMA_BENCH_FLAGS / BATCHED_BENCH_FLAGS (replace the test flags above; -m, -ngl and -fa stay).
set -uo pipefail

die() { echo "llama_cpp_peer: $*" >&2; exit 2; }

mode=gpu
tarball="build-llamacpp/llama.cpp-src.tar.gz"
kb=build/kb_nano
config=""
dtype=f16
work=""
skip_kb=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-smoke) mode=cpu; shift ;;
    --tarball) tarball=${2:?--tarball needs a file}; shift 2 ;;
    --kb-nano) kb=${2:?--kb-nano needs a file}; shift 2 ;;
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --dtype) dtype=${2:?--dtype needs f16 or bf16}; shift 2 ;;
    --work) work=${2:?--work needs a folder}; shift 2 ;;
    --skip-kb-nano) skip_kb=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $dtype == f16 || $dtype == bf16 ]] || die "--dtype: expected f16 or bf16, got '$dtype'"
if [[ $mode == gpu ]]; then
  config=${config:-models/llama-3.1-8b-instruct.json}; work=${work:-/tmp/kbn_llama_cpp}; jobs=${LLAMA_JOBS:-16}
else
  config=${config:-models/tiny-llama.json}; work=${work:-/tmp/kbn_llama_cpp_smoke}; jobs=${LLAMA_JOBS:-1}
fi
py=${PYTHON:-python3}
root=$PWD

# --- preflight: name what is missing, before any time is spent
[[ -f tools/llama_cpp_gguf.py && -f tools/llama_cpp_peer_report.py ]] ||
  die "run from the kb-nano repo root (tools/llama_cpp_gguf.py and tools/llama_cpp_peer_report.py not found in $PWD)"
[[ -f $tarball ]] || die "llama.cpp tarball not found: $tarball (make it on a machine with network: tools/llama_cpp_fetch.sh; carry it to the device)"
[[ -f $config ]] || die "model config not found: $config"
for tool in cmake tar timeout "$py"; do command -v "$tool" >/dev/null || die "'$tool' is missing"; done
"$py" -c 'import numpy' 2>/dev/null || die "$py has no numpy (apt-get install python3-numpy, or PYTHON=/path/to/python3 with numpy)"
if command -v ninja >/dev/null; then generator=Ninja; else generator="Unix Makefiles"; fi
if [[ $mode == gpu ]]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi is missing: no GPU here? (--cpu-smoke runs without one)"
  nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  [[ -n $nvcc ]] || die "nvcc is missing (not on PATH, not /usr/local/cuda/bin/nvcc): llama.cpp's CUDA backend cannot be built"
  if [[ $skip_kb == 0 ]]; then
    [[ -x $kb ]] || die "kb_nano not found or not executable: $kb (carry build/kb_nano with build/lib, or --skip-kb-nano)"
  fi
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
fi
export KBN_FIXTURE_DIR=$root/tests/fixtures KBN_MODELS_DIR=$root/models

outroot=${OUT:-out}
mkdir -p "$outroot" || die "cannot create $outroot"
outroot=$(cd "$outroot" && pwd)
out=$outroot/llama_peer
rm -rf "$out"; mkdir -p "$out" "$work" || die "cannot create $out or $work"
work=$(cd "$work" && pwd)
tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")
[[ $kb == /* ]] || kb=$root/$kb

total_s=${TOTAL_S:-540}
reserve_s=25  # kept for the report and the packing at the end
t_start=$SECONDS
deadline=$((t_start + total_s - reserve_s))
status=$out/status.txt
: >"$status"

# step NAME SECONDS CMD...: the command under min(SECONDS, time left), all its output in NAME.log; a line in
# status.txt: "NAME rc=RC SECONDSs: CMD" (rc=skip when no time was left). Never stops the run.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  if ((left < 5)); then
    echo "$name rc=skip 0s: (no time left of TOTAL_S=$total_s) $*" | tee -a "$status"; return 99
  fi
  ((limit > left)) && limit=$left
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s (limit ${limit}s, at +$((SECONDS - t_start))s): ${shown:-$*}" | tee -a "$status"
  return $rc
}
# step_out NAME SECONDS FILE CMD...: as step, with the command's stdout alone in FILE (its stderr in NAME.log).
step_out() {
  local name=$1 limit=$2 file=$3; shift 3
  local shown="$* > $file"
  # shellcheck disable=SC2016  # expanded by the inner bash
  step "$name" "$limit" bash -c 'f=$1; shift; exec "$@" >"$f"' _ "$file" "$@"
}
skip() { echo "$1 rc=skip 0s: $2" | tee -a "$status"; }

echo "llama_cpp_peer: $mode mode, out $out, work $work, config $config ($dtype), budget ${total_s}s"

# --- 1. provenance
{
  echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "mode=$mode"
  echo "host=$(uname -srm)"
  echo "nproc=$(nproc)"
  echo "kb_nano_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "kb_nano_tree=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
  echo "kb_nano_binary=$kb"
  echo "config=$config"
  echo "dtype=$dtype"
  echo "tarball=$tarball"
  echo "tarball_sha256=$(sha256sum "$tarball" | cut -d' ' -f1)"
  echo "generator=$generator"
  echo "cmake=$(cmake --version | head -1)"
  echo "python=$("$py" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)')"
} >"$out/provenance.txt"
smi_pid=""
if [[ $mode == gpu ]]; then
  nvidia-smi >"$out/nvidia_smi.txt" 2>&1
  nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >"$out/nvidia_smi_clocks.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv >"$out/gpu.csv" 2>&1
  "$nvcc" --version >"$out/nvcc.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used,clocks_throttle_reasons.active \
    --format=csv -lms 200 >"$out/smi.csv" 2>/dev/null &
  smi_pid=$!
fi
cleanup() { [[ -n $smi_pid ]] && kill "$smi_pid" 2>/dev/null; }
trap cleanup EXIT

# --- 2. source and build
src=$work/llama.cpp
step untar 60 tar -xzf "$tarball" -C "$work"
untar_rc=$?
commit=""
if [[ $untar_rc == 0 && -f $src/LLAMA_CPP_SOURCE.json ]]; then
  cp "$src/LLAMA_CPP_SOURCE.json" "$out/"
  commit=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$src/LLAMA_CPP_SOURCE.json" 2>/dev/null)
fi
build=$work/build-$mode
cmake_args=(-S "$src" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_COMMIT="${commit:0:7}" -DLLAMA_BUILD_NUMBER=0)
nice_cmd=()
if [[ $mode == gpu ]]; then
  cmake_args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_COMPILER="$nvcc")
else
  cmake_args+=(-DGGML_CUDA=OFF)
  nice_cmd=(nice -n 19)
fi
built=0
if [[ $untar_rc == 0 ]]; then
  if step configure 120 "${nice_cmd[@]}" cmake "${cmake_args[@]}"; then
    # The build and the GGUF at the same time: both are CPU work; the GPU runs wait for both.
    step build 420 "${nice_cmd[@]}" cmake --build "$build" -j "$jobs" --target llama-bench llama-batched-bench &
    build_pid=$!
  else
    skip build "configure failed (configure.log)"; build_pid=""
  fi
else
  skip configure "untar failed (untar.log)"; skip build "untar failed"; build_pid=""
fi
gguf=$work/model-$(basename "$config" .json)-$dtype.gguf
if [[ $untar_rc == 0 ]]; then
  # (the writer checks the free space of --work against the file's size first, and names a full disk)
  echo "free_kb_in_work=$(df -Pk "$work" | awk 'NR==2 {print $4}')" >>"$out/provenance.txt"
  rm -f "$gguf"
  step gguf 300 "$py" tools/llama_cpp_gguf.py --llama-cpp "$src" --config "$config" --dtype "$dtype" --out "$gguf" &
  gguf_pid=$!
else
  skip gguf "untar failed"; gguf_pid=""
fi
[[ -n $build_pid ]] && wait "$build_pid"
[[ -n $gguf_pid ]] && wait "$gguf_pid"
[[ -f ${gguf%.gguf}.json ]] && cp "${gguf%.gguf}.json" "$out/gguf.json"
bench=$build/bin/llama-bench
bbench=$build/bin/llama-batched-bench
[[ -x $bench && -x $bbench ]] && built=1
have_gguf=0
[[ -s $gguf && -f ${gguf%.gguf}.json ]] && have_gguf=1

# --- 4. kb_nano (GPU mode), or one tiny CPU eval to exercise the report (smoke)
if [[ $skip_kb == 1 ]]; then
  skip kb_nano "--skip-kb-nano"
elif [[ $mode == gpu ]]; then
  # The same model as the GGUF's: a models/ name, or the config's path
  kb_model=$config
  [[ $config == models/*.json && -f $root/$config ]] && kb_model=$(basename "$config" .json)
  step kb_latency_b1 240 "$kb" eval --model "$kb_model" --workload latency-b1 --mode graph --variant baseline --max-model-len 4096 \
    --json "$out/kb_latency_b1.json"
  step kb_prefill_4096 240 "$kb" eval --model "$kb_model" --workload latency-b1 --mode graph --variant baseline --scale 32 \
    --num-requests "${PREFILL_REQUESTS:-2}" --max-model-len 8256 --json "$out/kb_prefill_4096.json"
  step kb_batched_256 240 "$kb" eval --model "$kb_model" --workload latency-b32 --mode graph --variant baseline --scale 4 \
    --num-requests 256 --max-num-seqs 256 --max-model-len 4096 --json "$out/kb_batched_256.json"
elif [[ -x $kb ]]; then
  step kb_cpu_smoke 120 "${nice_cmd[@]}" "$kb" eval --device cpu --model tiny-llama --workload latency-b1 \
    --num-requests 2 --variant baseline --json "$out/kb_latency_b1.json"
else
  skip kb_cpu_smoke "no kb_nano at $kb"
fi

# --- 5. llama.cpp
if [[ $built == 0 ]]; then
  skip llama_bench "llama-bench / llama-batched-bench not built (build.log)"
elif [[ $have_gguf == 0 ]]; then
  skip llama_bench "no GGUF (gguf.log)"
elif [[ $mode == gpu ]]; then
  # shellcheck disable=SC2086  # the flag lists are lists
  step_out llama_bench 240 "$out/llama_bench.json" "$bench" -m "$gguf" -ngl 99 -fa 1 \
    ${LLAMA_BENCH_FLAGS:--p 512,4096 -n 128 -ub 512,2048 -r 5} -o json
  # shellcheck disable=SC2086
  step_out llama_batched_bench 240 "$out/llama_batched_bench.jsonl" "$bbench" -m "$gguf" -ngl 99 -fa on \
    ${BATCHED_BENCH_FLAGS:--c 262144 -b 2048 -ub 512 -npp 512 -ntg 512 -npl 256} --output-format jsonl
else
  threads=${LLAMA_THREADS:-1}  # 1: a busy development machine makes spinning threads crawl
  # shellcheck disable=SC2086
  step_out llama_bench 240 "$out/llama_bench.json" "${nice_cmd[@]}" "$bench" -m "$gguf" -ngl 0 -fa 1 -t "$threads" \
    ${LLAMA_BENCH_FLAGS:--p 64 -n 16 -r 2} -o json
  # shellcheck disable=SC2086
  step_out llama_batched_bench 240 "$out/llama_batched_bench.jsonl" "${nice_cmd[@]}" "$bbench" -m "$gguf" -ngl 0 \
    -fa on -t "$threads" ${BATCHED_BENCH_FLAGS:--c 512 -b 512 -ub 512 -npp 32 -ntg 16 -npl 4} --output-format jsonl
fi
[[ -z ${KEEP_GGUF:-} ]] && rm -f "$gguf"

# --- 6. report and packing (outside the step budget: the reserve)
cleanup; smi_pid=""
deadline=$((deadline + reserve_s - 5))
step report 20 "$py" tools/llama_cpp_peer_report.py --dir "$out" --markdown "$outroot/llama_peer.md" \
  --json "$outroot/llama_peer.json"
echo "total $((SECONDS - t_start))s" | tee -a "$status"
cp "$status" "$outroot/llama_peer_status.txt"
tar -czf "$outroot/llama_peer.tar.gz" -C "$outroot" llama_peer llama_peer.md llama_peer.json 2>/dev/null ||
  tar -czf "$outroot/llama_peer.tar.gz" -C "$outroot" llama_peer
# The device returns at most 8 files from $OUT: the folder's files travel in the tarball, the folder moves to --work.
rm -rf "$work/llama_peer_run" && mv "$out" "$work/llama_peer_run"
echo "llama_cpp_peer: $outroot/llama_peer.{md,json,tar.gz}, llama_peer_status.txt (the run folder, also in the tarball: $work/llama_peer_run)"
[[ -f $outroot/llama_peer.md ]] && cat "$outroot/llama_peer.md"
exit 0
