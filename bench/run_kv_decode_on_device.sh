#!/usr/bin/env bash
# On the GPU machine: the quantized-cache decode path before and after a change, same run. Every
# GPU test binary of the carried bundle, then `exl3 bench model` at batch 1 and 8 after CONTEXT
# tokens (default 16384) for each cache format, alternating `exl3_before` (the bundle's copy of the
# older build) and `exl3` (this tree), on a Qwen3-30B-A3B-geometry K4 synthetic checkpoint cut to
# LAYERS decoder layers (default 12: the same layers, written four times faster). Everything but
# summary.txt is packed into OUT/results.tar.xz.
# Usage: [LAYERS=12] [CONTEXT=16384] bash bench/run_kv_decode_on_device.sh OUT
set -uo pipefail
out="$1"
layers="${LAYERS:-12}" context="${CONTEXT:-16384}"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-l$layers-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4 --layers "$layers"
for f in auto fp8 q8 q4; do
  for build in before after; do
    exe="$bin/exl3"; [ "$build" = before ] && exe="$bin/exl3_before"
    timeout 120 "$exe" bench model "$model" --batch 1,8 --context "$context" --prefill 0 \
      --steps 32 --kv-cache "$f" --json "$out/kv_${f}_${build}.json" > "$out/kv_${f}_${build}.txt" 2>&1
    echo "$f $build rc=$?" | tee -a "$out/summary.txt"
    grep -E "^ +[0-9]+ " "$out/kv_${f}_${build}.txt" | tee -a "$out/summary.txt"
  done
done
(cd "$out" && tar -cJf results.tar.xz --remove-files --exclude summary.txt --exclude results.tar.xz *)
