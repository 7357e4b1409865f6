#!/usr/bin/env bash
# On the GPU machine: every GPU test binary of the carried bundle, then `exl3 bench model` on one
# Qwen3-30B-A3B-geometry synthetic checkpoint with two builds in the same run, alternating
# (before, after, before, after) so clock and thermal drift fall on both: `exl3_before` (the
# bundle's copy of an older build) and `exl3` (this tree). The checkpoint is written once. With
# PROFILE=1, Nsight Compute kernel times of this tree's decode steps (batch 1 and 8, 4-layer cut:
# bench/profile_decode_on_device.sh) follow. Everything but summary.txt is packed into
# OUT_DIR/results.tar.xz, since the device tool brings back only a few files per call.
# Usage: [PROFILE=1] bash bench/run_before_after_on_device.sh OUT_DIR [BITS]
set -uo pipefail
out="$1"; bits="${2:-4}"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-k$bits
timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" --out "$model" \
  --prepare-only > "$out/prepare.txt" 2>&1
echo "prepare rc=$?" | tee -a "$out/summary.txt"
for round in 1 2; do
  for build in before after; do
    exe="$bin/exl3"; [ "$build" = before ] && exe="$bin/exl3_before"
    timeout 240 "$exe" bench model "$model" --batch 1,8,64 --prefill 2048 \
      --json "$out/bench_${build}_r$round.json" > "$out/bench_${build}_r$round.txt" 2>&1
    echo "bench $build round $round rc=$?" | tee -a "$out/summary.txt"
    grep -E "batch|prefill" "$out/bench_${build}_r$round.txt" | head -n 6 | tee -a "$out/summary.txt"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  source bench/profile_decode_on_device.sh
  mkdir -p "$out/ncu"
  profile_decode "$out/ncu" "$bits" 4 1 8
fi
(cd "$out" && tar -cJf results.tar.xz --remove-files --exclude summary.txt --exclude results.tar.xz *)
