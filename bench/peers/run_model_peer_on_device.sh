#!/usr/bin/env bash
# On the GPU machine: exllamav3's model-level decode speed (bench/peers/exllamav3_model.py) on an
# EXL3 checkpoint, for comparison with `exl3 bench model` in the same run. Needs, carried from the
# dev machine: .peer/ (exllamav3 1.6.5 wheel, pure Python: its CUDA extension JIT-builds on first
# import, plus pydantic/pydantic-core/annotated-types/typing-inspection/typing-extensions/marisa-trie).
# Usage: bash bench/peers/run_model_peer_on_device.sh MODEL_DIR OUT_DIR
#        (MODEL_DIR --build-only: install and build the extension, no benchmark)
# The extension build is cached under /tmp/torch_extensions while the machine stays warm, so a
# second call on the same machine skips step 1's build.
set -euo pipefail
model="$1"
out="$2"
mkdir -p "$out"

# No registry on the device: install from the carried wheels only, into a private site dir.
# Installed once per warm machine: reinstalling gives the extension's sources new times, and the
# JIT build (ninja) then recompiles all of it (minutes) instead of reusing /tmp/torch_extensions.
[ -d /tmp/site/exllamav3 ] ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .peer/*.whl
export PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
# The extension cache lives in /tmp, which (unlike the home folder) is what a warm machine keeps.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}

# A build killed by a timeout leaves torch's lock file behind, and every later import then waits
# on it forever: drop it unless a build is running now.
pgrep -f "ninja.*exllamav3_ext" > /dev/null || rm -f "$TORCH_EXTENSIONS_DIR/exllamav3_ext/lock"

# 1. Import alone, timed: the first import JIT-compiles exllamav3_ext (minutes), so a timeout here
#    is the build, not the benchmark.
t0=$(date +%s)
python3 -c 'import exllamav3, exllamav3.ext; from exllamav3.version import __version__; print("exllamav3", __version__, "imported")'
echo "exllamav3 import (extension build) took $(( $(date +%s) - t0 )) s" | tee "$out/exllamav3_build_time.txt"

[ "$model" = "--build-only" ] && exit 0

# 2. Decode speed, batch 1 and 8, both modes (generator and raw forward).
python3 bench/peers/exllamav3_model.py --model "$model" --batch 1,8 --decode-tokens 128 --prompt-tokens 32 \
  --warmup 1 --reps 3 --out "$out/exllamav3_model.json" 2>&1 | tee "$out/exllamav3_model.log"
