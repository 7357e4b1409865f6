#!/usr/bin/env bash
# On the GPU machine: every bundled GPU test, then decode speed of one Qwen3-30B-A3B-geometry K4
# synthetic checkpoint with the dense GEMV's fused input rotation off and on
# (EXL3_GEMV_FUSED_ROTATION, one binary); then the Qwen3-Next 8-layer cut (prefill: the chunked
# DeltaNet recurrence) and, with
# PROFILE=1, Nsight Compute kernel times of a 4-layer Qwen3-30B-A3B cut's decode steps.
# Usage: [PROFILE=1] bash bench/run_fused_rotation_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-k4
start=$(date +%s)
synthetic $model "$out/prepare_q30.txt" qwen3-30b-a3b --bits 4
echo "== prepare q30 rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
# The fused rotation off (the default) and on, interleaved so drift falls on both.
for run in off:1 on:1 off:2 on:2; do
  cfg=${run%:*}; round=${run#*:}
  fused=0; [ "$cfg" = on ] && fused=1
  EXL3_GEMV_FUSED_ROTATION=$fused timeout 200 "$bin/exl3" bench model $model --batch 1,8,64 \
    --prefill 2048 --json "$out/q30_k4_${cfg}_r$round.json" > "$out/q30_k4_${cfg}_r$round.txt" 2>&1
  echo "== q30 fused rotation $cfg round $round rc=$?: EXL3_GEMV_FUSED_ROTATION=$fused exl3 bench model $model --batch 1,8,64 --prefill 2048" \
    | tee -a "$out/summary.txt"
  grep -E "^ +[0-9]+ |prefill" "$out/q30_k4_${cfg}_r$round.txt" | tee -a "$out/summary.txt"
done
m=/tmp/qwen3-next-l8-k4
start=$(date +%s)
synthetic $m "$out/prepare_next.txt" qwen3-next-80b-a3b --layers 8 --bits 4
echo "== prepare qwen3-next rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
timeout 200 "$bin/exl3" bench model $m --batch 1,8,64 --prefill 2048 \
  --json "$out/qwen3_next_l8_k4.json" > "$out/qwen3_next_l8_k4.txt" 2>&1
echo "== qwen3-next rc=$?: exl3 bench model $m --batch 1,8,64 --prefill 2048" | tee -a "$out/summary.txt"
grep -E "^ +[0-9]+ |prefill" "$out/qwen3_next_l8_k4.txt" | tee -a "$out/summary.txt"
timeout 120 "$bin/exl3" bench model $m --batch 1 --prefill 2048 --profile \
  --json "$out/qwen3_next_l8_k4_profile.json" > "$out/qwen3_next_l8_k4_profile.txt" 2>&1
echo "== qwen3-next profile rc=$?" | tee -a "$out/summary.txt"
if [ "${PROFILE:-0}" = 1 ]; then
  source bench/profile_decode_on_device.sh
  mkdir -p "$out/ncu"
  profile_decode "$out/ncu" 4 4 1 8
fi
