#!/usr/bin/env bash
# On the GPU machine: decode and prefill speed of the Qwen3-Next-80B-A3B geometry through the CUDA
# engine (gated DeltaNet layers with their state pool, gated attention every fourth layer, 512
# experts top-10 beside a gated shared expert), on a synthetic K4 checkpoint cut to its first
# LAYERS layers (default 8: 6 DeltaNet + 2 attention; random valid trellis bits: a speed benchmark
# only), beside the bandwidth ceiling `bench model` prints, then a batch-1 decode step and a 2k
# prefill profiled per op class. With `tests`, every bundled GPU test first (gpu_tests in bench/device_env.sh).
# Usage: bash bench/run_qwen3_next_on_device.sh OUT [tests]
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
[ "${2:-}" = "tests" ] && gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
layers=${LAYERS:-8}
m=/tmp/qwen3-next-l$layers-k4
start=$(date +%s)
synthetic $m "$out/prepare.txt" qwen3-next-80b-a3b --layers $layers --bits 4
echo "== prepare rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
start=$(date +%s)
timeout 240 "$bin/exl3" bench model $m --batch ${BATCHES:-1,8,64} --prefill 2048 \
  --json "$out/qwen3_next_l${layers}_k4.json" > "$out/qwen3_next_l${layers}_k4.txt" 2>&1
echo "== bench rc=$? $(( $(date +%s) - start ))s: exl3 bench model $m --batch ${BATCHES:-1,8,64} --prefill 2048" \
  | tee -a "$out/summary.txt"
tail -n 12 "$out/qwen3_next_l${layers}_k4.txt" | tee -a "$out/summary.txt"
# Where a batch-1 decode step's and a 2k prefill's time goes, per op class (eager launches, an
# event after each op).
timeout 120 "$bin/exl3" bench model $m --batch 1 --prefill 2048 --profile \
  --json "$out/qwen3_next_l${layers}_k4_profile.json" > "$out/qwen3_next_l${layers}_k4_profile.txt" 2>&1
echo "== profile rc=$?" | tee -a "$out/summary.txt"
tail -n 32 "$out/qwen3_next_l${layers}_k4_profile.txt" >> "$out/summary.txt"
