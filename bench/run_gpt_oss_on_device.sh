#!/usr/bin/env bash
# On the GPU machine: decode and prefill speed of the gpt-oss-120b and gpt-oss-20b geometries
# through the CUDA engine (attention sinks, sliding / full layers, biased router and experts with
# the clamped SwiGLU, 2880 channels padded to 2944), on synthetic K4 checkpoints cut to their
# first 4 layers (random valid trellis bits: a speed benchmark only), beside the bandwidth ceiling
# `bench model` prints. With `tests`, every bundled GPU test first (gpu_tests in
# bench/device_env.sh). A geometry starts only while the call has DEADLINE seconds left of its
# start (default 540), so a 600 s call returns what it measured.
# Usage: bash bench/run_gpt_oss_on_device.sh OUT [tests]
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
[ "${2:-}" = "tests" ] && gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
run() {  # NAME ARGS...: one bench invocation, its table and exit status into the summary
  local name="$1"; shift
  local start=$(date +%s)
  timeout 200 "$bin/exl3" bench model "$@" --json "$out/$name.json" > "$out/$name.txt" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - start ))s: exl3 bench model $*" | tee -a "$out/summary.txt"
  tail -n 12 "$out/$name.txt" | tee -a "$out/summary.txt"
}
for g in gpt-oss-120b gpt-oss-20b; do
  if [ "$SECONDS" -gt $(( ${DEADLINE:-540} - 200 )) ]; then
    echo "== $g: skipped, the call's time is nearly spent" | tee -a "$out/summary.txt"
    continue
  fi
  m=/tmp/$g-l4-k4
  run "${g}_prepare" --synthetic $g --layers 4 --bits 4 --out $m --prepare-only
  run "${g}_l4_k4" $m --batch 1,8,64 --prefill 2048
done
