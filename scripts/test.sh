#!/usr/bin/env bash
# Sets up, builds everything and runs the tests. Without a GPU the `gpu` label is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${KBN_BUILD_DIR:-build}
cmake --build "$build"
labels=()
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test: no GPU visible, skipping tests labelled gpu"
  labels=(-LE gpu)
fi
ctest --test-dir "$build" --output-on-failure "${labels[@]}" "$@"
