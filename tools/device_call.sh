#!/usr/bin/env bash
# Sourced by the device-call scripts under bench/results/session*/ (run on the GPU machine from the repo root, with
# build-dev/ carried, see tools/pack_device_build.sh): puts the carried binaries back, points the loader and the model
# configs at the tree, makes $O = $OUT/s for the call's files, records the GPU, and defines
#   st NAME LIMIT_S CMD...   run CMD into $O/NAME.log under a time limit; append "NAME rc=.. s=.." to $O/status.txt
#   unxz_to SRC.xz DST       decompress an xz-compressed binary (kept small to fit the carry limit) and mark it
#                            executable (python's lzma: the machine has no guarantee of xz)
#   finish                   tar $O into $OUT/s.tgz (one file to fetch) and remove it
set -u
build-dev/unpack.sh
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee "$O/gpu.txt"
st() {
  local name=$1 lim=$2
  shift 2
  local t0
  t0=$(date +%s)
  timeout -k 5 "$lim" "$@" >"$O/$name.log" 2>&1
  echo "$name rc=$? s=$(($(date +%s) - t0))" | tee -a "$O/status.txt"
}
unxz_to() {
  mkdir -p "$(dirname "$2")"
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2"
  chmod +x "$2"
}
finish() { (cd "$OUT" && tar czf s.tgz s && rm -rf s); }
