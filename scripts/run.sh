#!/usr/bin/env bash
# The main job in one command: set up, build, and generate with the embedded default model for this
# machine (tiny Llama on CPU; Llama-3.1-8B-Instruct with seeded random weights on a GPU).
# Extra arguments go to `kb_nano generate` (e.g. --model llama-3.2-1b-instruct --max-new-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --build "${KBN_BUILD_DIR:-build}" --target kb_nano
exec "${KBN_BUILD_DIR:-build}/kb_nano" generate "$@"
