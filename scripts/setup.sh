#!/usr/bin/env bash
# Installs what kb-nano needs to build and test, from Debian packages only, then configures build/.
# The CUDA toolkit is used when present (nvcc on PATH or in /usr/local/cuda); without it the build is CPU-only.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake ninja-build g++ git nlohmann-json3-dev libcli11-dev libgtest-dev librapidcheck-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B "${KBN_BUILD_DIR:-build}" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
echo "setup: configured ${KBN_BUILD_DIR:-build} ($(command -v nvcc >/dev/null && echo "CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" || echo "CPU-only"))"
