#!/usr/bin/env bash
# A second kb_nano for a same-call A/B on the GPU machine, without a second build tree: the given baseline sources are
# recompiled with extra defines (typically a fusion's candidate switch, e.g.
# -DKBN_CANDIDATE_REPLACES_L1_store_kvcache_h, which turns the fused path off), swapped into a copy of build/'s task
# library, and kb_nano is relinked against it. Seconds per source instead of a full build on two cores; the binary is
# written stripped and xz-compressed when OUT ends in .xz (what fits beside build-dev/ in the device's 64 MiB carry; unpack it there
# with tools/device_call.sh's unxz_to).
#
#   tools/relink_variant.sh OUT "DEFINES" SOURCE...
#   tools/relink_variant.sh build-cmp/off.xz "-DKBN_CANDIDATE_REPLACES_L1_store_kvcache_h" \
#       tasks/baseline/L2/qwen3_attention.cu tasks/baseline/L2/gemma3_attention.cu
#
# build/ must be configured and kb_nano built (ninja -C build kb_nano); SOURCE paths are relative to the repo root.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 OUT \"DEFINES\" SOURCE..." >&2
  exit 2
fi
out=$1
defines=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
lib=libkbn_tasks_baseline.a
[ -f "$build/$lib" ] && [ -f "$build/kb_nano" ] || {
  echo "$0: build/$lib and build/kb_nano must exist (run: ninja -C build kb_nano)" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
commands=$(ninja -C "$build" -t commands kb_nano)
cp "$build/$lib" "$work/$lib"
objects=()
for src in "$@"; do
  abs=$root/$src
  [ -f "$abs" ] || {
    echo "$0: no source $src" >&2
    exit 1
  }
  compile=$(grep -F -- "-c $abs -o " <<<"$commands" | head -1)
  [ -n "$compile" ] || {
    echo "$0: $src is not compiled into kb_nano's task library (no compile command names it)" >&2
    exit 1
  }
  obj=$(basename "$src").o  # the archive's member name (build/ holds no two task sources of one name)
  # The same command with the defines added, the object written here, no dependency file.
  compile=$(sed -e "s| -o [^ ]*$| -o $work/$obj|" -e "s| -o [^ ]* | -o $work/$obj |" \
    -e 's| -MD -MT [^ ]* -MF [^ ]*||' -e "s|-DKBN_VARIANT=baseline|-DKBN_VARIANT=baseline $defines|" <<<"$compile")
  (cd "$build" && eval "$compile")
  objects+=("$obj")
done
(cd "$work" && ar r "$lib" "${objects[@]}")
link=$(grep -E -- " -o kb_nano( |$)" <<<"$commands" | tail -1)
[ -n "$link" ] || {
  echo "$0: no link command for kb_nano in build/" >&2
  exit 1
}
link=$(sed -e "s|\([ ,=]\)$lib|\1$work/$lib|g" -e "s| -o kb_nano| -o $work/kb_nano|" <<<"$link")
(cd "$build" && eval "$link")
mkdir -p "$(dirname "$out")"
case $out in
  *.xz) strip "$work/kb_nano" && python3 -c \
    "import lzma,shutil,sys; shutil.copyfileobj(open(sys.argv[1],'rb'), lzma.open(sys.argv[2],'wb'))" "$work/kb_nano" "$out" ;;
  *) cp "$work/kb_nano" "$out" ;;
esac
echo "relink_variant: $out (kb_nano with ${*} recompiled with $defines)"
