#!/usr/bin/env bash
# On the GPU machine, two calls back to back on one warm machine (its /tmp carries over):
#   bash bench/run_decode_peer_on_device.sh prepare OUT   GPU tests of the bundle while exllamav3's
#        extension builds in the background (bench/peers/run_model_peer_on_device.sh --build-only),
#        then the Qwen3-30B-A3B-geometry K4 checkpoint in /tmp/q30-k4
#   bash bench/run_decode_peer_on_device.sh bench OUT     exl3 (this bundle's, and exl3_before when
#        bundled) alternately, then exllamav3 1.6.5 on the same checkpoint
# Needs .devpack/bundle.tar.xz (scripts/device_bundle.sh + xz), .conf/ and .peer/.
set -uo pipefail
phase="$1" out="$2"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
model=/tmp/q30-k4
if [ "$phase" = prepare ]; then
  bash bench/peers/run_model_peer_on_device.sh --build-only "$out" > "$out/peer_build.log" 2>&1 &
  peer=$!
  gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
  timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits 4 --out "$model" --prepare-only \
    > "$out/prepare.txt" 2>&1
  echo "prepare rc=$?" | tee -a "$out/summary.txt"
  wait $peer
  echo "peer build rc=$? $(cat "$out/exllamav3_build_time.txt" 2>/dev/null)" | tee -a "$out/summary.txt"
  exit 0
fi
for round in 1 2; do
  for build in after before; do
    exe="$bin/exl3"
    if [ "$build" = before ]; then exe="$bin/exl3_before"; [ -x "$exe" ] || continue; fi
    timeout 100 "$exe" bench model "$model" --batch 1,8,64 --prefill 2048 \
      --json "$out/bench_${build}_r$round.json" > "$out/bench_${build}_r$round.txt" 2>&1
    echo "bench $build round $round rc=$?" | tee -a "$out/summary.txt"
    grep -E "^ +[0-9]+ |prefill|kernels" "$out/bench_${build}_r$round.txt" | tee -a "$out/summary.txt"
  done
done
timeout 200 bash bench/peers/run_model_peer_on_device.sh "$model" "$out" > "$out/peer_bench.log" 2>&1
echo "peer bench rc=$?" | tee -a "$out/summary.txt"
grep -E "tok/s" "$out/peer_bench.log" | tee -a "$out/summary.txt"
