#!/usr/bin/env bash
# On the GPU machine, exl3 against exllamav3 1.6.5 on one checkpoint, in two calls back to back on
# one warm machine (its /tmp carries over between them):
#   bash bench/run_decode_peer_on_device.sh prepare OUT   exllamav3's extension builds in the
#        background (bench/peers/run_model_peer_on_device.sh --build-only, about 5 minutes) while
#        bench/run_before_after_on_device.sh runs the GPU tests and the exl3 benches on /tmp/q30-k4
#   bash bench/run_decode_peer_on_device.sh peer OUT      exllamav3's decode benchmark there
# Needs .devpack/bundle.tar.xz (with exl3_before), .conf/ and .peer/.
set -uo pipefail
phase="$1" out="$2"
mkdir -p "$out"
if [ "$phase" = prepare ]; then
  bash bench/peers/run_model_peer_on_device.sh --build-only "$out" > "$out/peer_build.log" 2>&1 &
  peer=$!
  bash bench/run_before_after_on_device.sh "$out" 4
  wait $peer
  echo "peer build rc=$? $(cat "$out/exllamav3_build_time.txt" 2>/dev/null)" | tee -a "$out/summary.txt"
  exit 0
fi
timeout 500 bash bench/peers/run_model_peer_on_device.sh /tmp/q30-k4 "$out" > "$out/peer_bench.log" 2>&1
echo "peer bench rc=$?" | tee -a "$out/summary.txt"
grep -E "tok/s" "$out/peer_bench.log" | tee -a "$out/summary.txt"
