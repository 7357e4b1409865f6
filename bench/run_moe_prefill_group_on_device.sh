#!/usr/bin/env bash
# On the GPU machine: the fused MoE's prefill groups of 32 against 64 route slots
# (EXL3_MOE_PREFILL_GROUP, one binary), then the prefill attention kernel's tile order, in one call:
#   1. the bundled GPU tests;
#   2. `exl3 moe-bench` on the Qwen3-30B-A3B layer (K4, per-expert rotations) at prefill m, each
#      group size, with the BF16 grouped-GEMM baseline of the same run;
#   3. `exl3 bench model` on the Qwen3-30B-A3B-geometry K4 synthetic checkpoint: batch 1 and a 2k
#      prefill with --profile, groups 32 / 64 / automatic alternating, two rounds; then one 32k
#      prompt in 2k chunks (automatic groups).
# Usage: bash bench/run_moe_prefill_group_on_device.sh OUT BUNDLE
set -uo pipefail
out="$1"; bundle="$2"
mkdir -p "$out"
source bench/device_env.sh "$bundle" || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
for g in 32 64; do
  EXL3_MOE_PREFILL_GROUP=$g timeout 200 "$bin/exl3" moe-bench --geometry qwen3-30b-a3b --tiers 4 \
    --layout per_expert --m 64,256,1024,2048,3072 --reps 10 --json "$out/moe_q30_k4_group$g.json" \
    > "$out/moe_q30_k4_group$g.txt" 2>&1
  echo "== moe-bench group $g rc=$?: EXL3_MOE_PREFILL_GROUP=$g exl3 moe-bench --geometry qwen3-30b-a3b --tiers 4 --layout per_expert --m 64,256,1024,2048,3072 --reps 10" \
    | tee -a "$out/summary.txt"
  grep -E "^m=" "$out/moe_q30_k4_group$g.txt" | tee -a "$out/summary.txt"
done
model=/tmp/q30-k4
start=$(date +%s)
synthetic $model "$out/prepare_q30.txt" qwen3-30b-a3b --bits 4
echo "== prepare q30 rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
for run in 32:1 64:1 auto:1 32:2 64:2 auto:2; do
  g=${run%:*}; round=${run#*:}
  env_g=$g; [ "$g" = auto ] && env_g=
  EXL3_MOE_PREFILL_GROUP=$env_g timeout 200 "$bin/exl3" bench model $model --batch 1 --prefill 2048 \
    --profile --json "$out/q30_prefill2k_group${g}_r$round.json" > "$out/q30_prefill2k_group${g}_r$round.txt" 2>&1
  echo "== prefill 2k group $g round $round rc=$?: EXL3_MOE_PREFILL_GROUP=$env_g exl3 bench model $model --batch 1 --prefill 2048 --profile" \
    | tee -a "$out/summary.txt"
  grep -E "prefill|attention|moe" "$out/q30_prefill2k_group${g}_r$round.txt" | tee -a "$out/summary.txt"
done
timeout 280 "$bin/exl3" bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048 \
  --json "$out/q30_prefill32k.json" > "$out/q30_prefill32k.txt" 2>&1
echo "== prefill 32k rc=$?: exl3 bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048" \
  | tee -a "$out/summary.txt"
grep -E "prefill" "$out/q30_prefill32k.txt" | tee -a "$out/summary.txt"
