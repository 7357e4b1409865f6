#!/usr/bin/env bash
# On the GPU machine, exl3 against exllamav3 1.6.5 on one checkpoint, in two calls back to back on
# one warm machine (its /tmp carries over between them):
#   bash bench/run_decode_peer_on_device.sh prepare OUT   exllamav3's extension builds in the
#        background (bench/peers/run_model_peer_on_device.sh --build-only, about 5 minutes, all
#        cores) while the bundle's GPU tests run and the Qwen3-30B-A3B-geometry K4 checkpoint is
#        written to /tmp/q30-k4; returns when the build is done
#   bash bench/run_decode_peer_on_device.sh peer OUT      on the idle machine, one after the
#        other: `exl3 bench model` (batch 1, 8, 64 and prefill 2048), `exl3 bench model
#        --draft-tokens 3` (batch 1 and 8), then exllamav3's decode benchmark on the same files
# Needs .devpack/bundle.tar.xz (with exl3), .conf/ and .peer/. Everything but summary.txt is packed
# into OUT/results.tar.xz (the device tool brings back only a few files per call).
set -uo pipefail
phase="$1" out="$2"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
model=/tmp/q30-k4
if [ "$phase" = prepare ]; then
  bash bench/peers/run_model_peer_on_device.sh --build-only "$out" > "$out/peer_build.log" 2>&1 &
  peer=$!
  gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
  timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits 4 --out "$model" \
    --prepare-only > "$out/prepare.txt" 2>&1
  echo "prepare rc=$?" | tee -a "$out/summary.txt"
  wait $peer
  echo "peer build rc=$? $(cat "$out/exllamav3_build_time.txt" 2>/dev/null)" | tee -a "$out/summary.txt"
else
  timeout 150 "$bin/exl3" bench model "$model" --batch 1,8,64 --prefill 2048 \
    --json "$out/bench_exl3.json" > "$out/bench_exl3.txt" 2>&1
  echo "exl3 bench rc=$?" | tee -a "$out/summary.txt"
  grep -E "^ +[0-9]+ |prefill" "$out/bench_exl3.txt" | tee -a "$out/summary.txt"
  timeout 200 "$bin/exl3" bench model "$model" --batch 1,8 --prefill 0 --steps 64 --draft-tokens 3 \
    --json "$out/bench_speculative.json" > "$out/bench_speculative.txt" 2>&1
  echo "speculative bench rc=$?" | tee -a "$out/summary.txt"
  sed -n '/^speculative/,$p' "$out/bench_speculative.txt" | tee -a "$out/summary.txt"
  timeout 240 bash bench/peers/run_model_peer_on_device.sh "$model" "$out" > "$out/peer_bench.log" 2>&1
  echo "peer bench rc=$?" | tee -a "$out/summary.txt"
  grep -E "tok/s" "$out/peer_bench.log" | tee -a "$out/summary.txt"
fi
(cd "$out" && tar -cJf results.tar.xz --remove-files --exclude summary.txt --exclude results.tar.xz *)
