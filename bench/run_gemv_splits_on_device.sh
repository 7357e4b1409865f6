#!/usr/bin/env bash
# On the GPU machine: every GPU test binary of the bundle, then `exl3 bench model` decode on the
# Qwen3-30B-A3B-geometry K4 checkpoint (batch 1, 8, 64) under a sweep of the GEMV and MoE decode
# split-K bounds (EXL3_GEMV_MAX_SPLITS, EXL3_GEMV_MIN_SPLIT_TILES, EXL3_MOE_MIN_SPLIT_TILES); the
# default settings run first and last, so the spread between them shows the run's noise.
# Needs .devpack/bundle.tar.xz and .conf/. Usage: bash bench/run_gemv_splits_on_device.sh OUT [CONFIGS]
# CONFIGS: space-separated NAME=GEMV_MAX_SPLITS/GEMV_MIN_SPLIT_TILES/MOE_MIN_SPLIT_TILES.
set -uo pipefail
out="$1"
configs="${2:-default=16/8/8 g32t4=32/4/8 g64t4=64/4/8 g64t2=64/2/8 g32t4m4=32/4/4 default2=16/8/8}"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
for c in $configs; do
  name=${c%%=*} v=${c#*=}
  IFS=/ read -r gs gt mt <<< "$v"
  EXL3_GEMV_MAX_SPLITS=$gs EXL3_GEMV_MIN_SPLIT_TILES=$gt EXL3_MOE_MIN_SPLIT_TILES=$mt \
    timeout 150 "$bin/exl3" bench model "$model" --batch 1,8,64 --prefill 0 --steps 64 \
    --json "$out/decode_$name.json" > "$out/decode_$name.txt" 2>&1
  echo "$name (gemv max splits $gs, min tiles $gt, moe min tiles $mt) rc=$?" | tee -a "$out/summary.txt"
  grep -E "^ +(batch|[0-9]+) " "$out/decode_$name.txt" | tee -a "$out/summary.txt"
done
(cd "$out" && tar -cJf ../splits_files.tar.xz --exclude summary.txt *)
