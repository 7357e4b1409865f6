#!/usr/bin/env bash
# On the GPU machine: kernel-level breakdown of decode steps with Nsight Compute (graph nodes
# profiled one by one, clocks left alone), on a reduced-layer Qwen3-30B-A3B-geometry synthetic
# model. Writes ncu_b<B>.csv (one row per kernel launch, gpu__time_duration) for each batch size;
# bench/summarize_ncu.py groups them into one decode step per op class.
# Needs the bundle sourced (bench/device_env.sh). Usage: profile_decode OUT BITS LAYERS BATCH...
profile_decode() {
  local out="$1" bits="$2" layers="$3" b model
  shift 3
  model=/tmp/q30-prof-k$bits-l$layers
  timeout 200 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" --layers "$layers" \
    --out "$model" --prepare-only > "$out/prof_prepare.txt" 2>&1
  for b in "$@"; do
    timeout 240 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
      --csv --print-units base "$bin/exl3" bench model "$model" --batch "$b" --steps 3 --context 16 \
      --prefill 0 > "$out/ncu_b$b.csv" 2> "$out/ncu_b$b.err"
    echo "ncu batch $b rc=$? lines=$(wc -l < "$out/ncu_b$b.csv")" | tee -a "$out/summary.txt"
  done
}
