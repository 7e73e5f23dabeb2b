#!/usr/bin/env bash
# The llama.cpp source for the side-by-side peer (issue 20, item 5), fetched and pruned on the DEVELOPMENT machine
# (the GPU machine has no network), packed into one tarball small enough to carry to the device with build/kb_nano.
#
# Source: the npm package node-llama-cpp@$NODE_LLAMA_CPP_VERSION (default 3.22.1) ships package/llama/gitRelease.bundle,
# a git bundle of the llama.cpp release named in package/llama/binariesGithubRelease.json (and llama.cpp.info.json).
# The bundle is cloned at that release's tag when the bundle holds the tag, else at its HEAD (the bundles of 3.22.1
# hold one squashed commit and no tags: the tag then comes from the JSON and the commit from the bundle).
#
# Kept: the CMake build (top level, cmake/, ggml/ with only the CPU and CUDA backends, src/, include/, common/,
# vendor/), tools/llama-bench and tools/batched-bench (tools/CMakeLists.txt is rewritten to add just those two),
# gguf-py/ (the GGUF writer) and the Llama-3 vocabulary models/ggml-vocab-llama-bpe.gguf, plus the licenses.
# Dropped: every other backend, tool, example, test, the docs and the other vocabularies.
#
# Usage (repo root):  tools/llama_cpp_fetch.sh [--out DIR]         (default DIR: build-llamacpp, ignored by /build*/)
# Environment:
#   NODE_LLAMA_CPP_VERSION   the npm package version (default 3.22.1)
#   NODE_LLAMA_CPP_TGZ       an already packed node-llama-cpp-<version>.tgz (else DIR/node-llama-cpp-<version>.tgz,
#                            else `npm pack` into DIR)
# Writes DIR/llama.cpp-src.tar.gz (one top folder, llama.cpp/, with LLAMA_CPP_SOURCE.json: package, tag, commit,
# bundle sha256, what was pruned) and DIR/llama.cpp-src.json (the same provenance, beside the tarball); prints the
# tarball's size, tag and commit. tools/llama_cpp_peer.sh builds and runs it on the GPU machine.
set -uo pipefail

die() { echo "llama_cpp_fetch: $*" >&2; exit 1; }

out=build-llamacpp
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (expected --out DIR)" ;;
  esac
done
for tool in git tar gzip sha256sum python3; do
  command -v "$tool" >/dev/null || die "'$tool' is missing on this machine"
done

version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
mkdir -p "$out" || die "cannot create '$out'"
out=$(cd "$out" && pwd)
tgz=${NODE_LLAMA_CPP_TGZ:-$out/node-llama-cpp-$version.tgz}
if [[ ! -s $tgz ]]; then
  command -v npm >/dev/null || die "no $tgz and no npm to fetch it with (set NODE_LLAMA_CPP_TGZ to a packed node-llama-cpp-$version.tgz)"
  echo "llama_cpp_fetch: npm pack node-llama-cpp@$version into $out"
  (cd "$out" && npm pack --silent "node-llama-cpp@$version" >/dev/null) || die "npm pack node-llama-cpp@$version failed"
  tgz=$out/node-llama-cpp-$version.tgz
  [[ -s $tgz ]] || die "npm pack wrote no $tgz"
fi

work=$(mktemp -d /tmp/llama_cpp_fetch.XXXXXX) || die "mktemp failed"
trap 'rm -rf "$work"' EXIT
tar -xzf "$tgz" -C "$work" package/llama/gitRelease.bundle package/llama/binariesGithubRelease.json \
  package/llama/llama.cpp.info.json 2>"$work/tar.err" ||
  die "$tgz lacks package/llama/gitRelease.bundle or its JSON: $(cat "$work/tar.err")"
bundle=$work/package/llama/gitRelease.bundle
tag=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["release"])' \
  "$work/package/llama/binariesGithubRelease.json") || die "cannot read the release tag from binariesGithubRelease.json"
repo=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("llamaCppGithubRepo", ""))' \
  "$work/package/llama/llama.cpp.info.json" 2>/dev/null || echo "")
bundle_sha=$(sha256sum "$bundle" | cut -d' ' -f1)

git clone -q --no-checkout "$bundle" "$work/clone" 2>"$work/clone.err" || die "git clone of the bundle failed: $(cat "$work/clone.err")"
if git -C "$work/clone" rev-parse -q --verify "refs/tags/$tag^{commit}" >/dev/null; then
  ref="refs/tags/$tag" ref_note="the bundle's tag $tag"
else
  ref=HEAD ref_note="the bundle's HEAD (it holds no tag $tag; the tag is the one binariesGithubRelease.json names)"
fi
commit=$(git -C "$work/clone" rev-parse "$ref^{commit}") || die "cannot resolve $ref in the bundle"
commit_date=$(git -C "$work/clone" log -1 --format=%cI "$commit")
commit_epoch=$(git -C "$work/clone" log -1 --format=%ct "$commit")

# The tree at that commit, then pruned.
src=$work/llama.cpp
mkdir -p "$src"
git -C "$work/clone" archive --format=tar "$commit" | tar -x -C "$src" || die "git archive of $commit failed"
for need in CMakeLists.txt ggml/src/ggml-cuda ggml/src/ggml-cpu tools/llama-bench tools/batched-bench gguf-py/gguf \
            models/ggml-vocab-llama-bpe.gguf common src include vendor; do
  [[ -e $src/$need ]] || die "the llama.cpp tree at $commit has no $need (layout changed?)"
done
pruned=()
prune() { local p; for p in "$@"; do [[ -e $src/$p ]] && { rm -rf "${src:?}/$p"; pruned+=("$p"); }; done; }
for d in "$src"/ggml/src/ggml-*/; do
  d=${d%/}; d=${d#"$src"/}
  [[ $d == ggml/src/ggml-cpu || $d == ggml/src/ggml-cuda ]] || prune "$d"
done
for d in "$src"/tools/*/; do
  d=${d%/}; d=${d#"$src"/}
  [[ $d == tools/llama-bench || $d == tools/batched-bench ]] || prune "$d"
done
for f in "$src"/models/*; do
  f=${f#"$src"/}
  [[ $f == models/ggml-vocab-llama-bpe.gguf ]] || prune "$f"
done
prune docs media examples pocs tests benches app scripts ci .github .devops skills conversion requirements \
  gguf-py/tests gguf-py/examples
cat >"$src/tools/CMakeLists.txt" <<'EOF'
# Pruned by kb-nano's tools/llama_cpp_fetch.sh: only the two benchmark tools.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
EOF

python3 - "$src/LLAMA_CPP_SOURCE.json" "$version" "$tag" "$repo" "$commit" "$commit_date" "$ref_note" "$bundle_sha" \
  "${pruned[@]}" <<'EOF' || die "cannot write LLAMA_CPP_SOURCE.json"
import json, sys
path, version, tag, repo, commit, date, ref_note, sha, *pruned = sys.argv[1:]
json.dump({
    "npm_package": f"node-llama-cpp@{version}",
    "bundle": "package/llama/gitRelease.bundle",
    "bundle_sha256": sha,
    "llama_cpp_repo": repo,
    "tag": tag,
    "commit": commit,
    "commit_date": date,
    "checked_out": ref_note,
    "pruned": pruned,
    "tools_cmakelists": "rewritten: add_subdirectory(batched-bench) and add_subdirectory(llama-bench) only",
}, open(path, "w"), indent=2)
EOF
cp "$src/LLAMA_CPP_SOURCE.json" "$out/llama.cpp-src.json"

tarball=$out/llama.cpp-src.tar.gz
# Reproducible: every entry stamped with the commit's time, no gzip name or time (the same bytes on every run).
tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name --mtime="@$commit_epoch" -cf - llama.cpp |
  gzip -9 -n >"$tarball.tmp" || die "cannot write $tarball"
mv "$tarball.tmp" "$tarball"
bytes=$(stat -c %s "$tarball")
limit=$((40 * 1024 * 1024))
echo "llama_cpp_fetch: $tarball: $bytes bytes ($(awk -v b="$bytes" 'BEGIN{printf "%.1f", b/1048576}') MiB)"
echo "llama_cpp_fetch: llama.cpp ${repo:+$repo }$tag, commit $commit ($commit_date), from node-llama-cpp@$version: $ref_note"
echo "llama_cpp_fetch: sha256 $(sha256sum "$tarball" | cut -d' ' -f1)"
if ((bytes > limit)); then
  die "the tarball is over 40 MiB: with build/kb_nano (~13 MiB) it would not fit the device's 64 MiB per call"
fi
