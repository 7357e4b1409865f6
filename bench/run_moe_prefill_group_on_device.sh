#!/usr/bin/env bash
# On the GPU machine: the fused MoE's prefill through the grouped GEMV (groups of 32 route slots)
# against the decode-once grouped GEMM (groups of 128), EXL3_MOE_PREFILL_GROUP, one binary:
#   1. the bundled GPU tests;
#   2. `exl3 moe-bench` on the Qwen3-30B-A3B layer (K4, per-expert rotations) and the GLM-5.2 rank
#      layer (K3, shared-H) at prefill m, each group size, with the BF16 grouped-GEMM baseline of
#      the same run;
#   3. `exl3 bench model` on the Qwen3-30B-A3B-geometry K4 synthetic checkpoint: a 2k prefill with
#      --profile, groups 32 / automatic alternating, two rounds; then one 32k prompt in 2k chunks
#      (automatic groups).
# Usage: bash bench/run_moe_prefill_group_on_device.sh OUT BUNDLE [kernels|model|all|quick]
# (kernels: steps 1-2, model: step 3, so each fits one device call; quick: the tests, the Qwen3
# layer and one 2k prefill per group size, in one call)
set -uo pipefail
out="$1"; bundle="$2"; phase="${3:-all}"
mkdir -p "$out"
source bench/device_env.sh "$bundle" || exit 1
if [ "$phase" != model ]; then
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
ms=256,512,1024,2048,3072
geos="qwen3-30b-a3b:4:per_expert glm52:3:shared_h"
[ "$phase" = quick ] && geos=qwen3-30b-a3b:4:per_expert
for geo in $geos; do
  IFS=: read -r name tiers layout <<< "$geo"
  for g in 32 128; do
    tag=moe_${name}_k${tiers}_group$g
    EXL3_MOE_PREFILL_GROUP=$g timeout 200 "$bin/exl3" moe-bench --geometry $name --tiers $tiers \
      --layout $layout --m $ms --reps 10 --json "$out/$tag.json" > "$out/$tag.txt" 2>&1
    echo "== $tag rc=$?: EXL3_MOE_PREFILL_GROUP=$g exl3 moe-bench --geometry $name --tiers $tiers --layout $layout --m $ms --reps 10" \
      | tee -a "$out/summary.txt"
    grep -E "^m=" "$out/$tag.txt" | tee -a "$out/summary.txt"
  done
done
fi
[ "$phase" = kernels ] && exit 0
model=/tmp/q30-k4
start=$(date +%s)
synthetic $model "$out/prepare_q30.txt" qwen3-30b-a3b --bits 4
echo "== prepare q30 rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
runs="32:1 auto:1 32:2 auto:2"
[ "$phase" = quick ] && runs="32:1 auto:1"
for run in $runs; do
  g=${run%:*}; round=${run#*:}
  env_g=$g; [ "$g" = auto ] && env_g=
  EXL3_MOE_PREFILL_GROUP=$env_g timeout 200 "$bin/exl3" bench model $model --batch 1 --prefill 2048 \
    --profile --json "$out/q30_prefill2k_group${g}_r$round.json" > "$out/q30_prefill2k_group${g}_r$round.txt" 2>&1
  echo "== prefill 2k group $g round $round rc=$?: EXL3_MOE_PREFILL_GROUP=$env_g exl3 bench model $model --batch 1 --prefill 2048 --profile" \
    | tee -a "$out/summary.txt"
  grep -E "prefill|attention|moe" "$out/q30_prefill2k_group${g}_r$round.txt" | tee -a "$out/summary.txt"
done
[ "$phase" = quick ] && exit 0
timeout 280 "$bin/exl3" bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048 \
  --json "$out/q30_prefill32k.json" > "$out/q30_prefill32k.txt" 2>&1
echo "== prefill 32k rc=$?: exl3 bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048" \
  | tee -a "$out/summary.txt"
grep -E "prefill" "$out/q30_prefill32k.txt" | tee -a "$out/summary.txt"
