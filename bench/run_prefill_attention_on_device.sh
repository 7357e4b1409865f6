#!/usr/bin/env bash
# On the GPU machine: prefill before and after the tensor-core prefill attention, on one
# Qwen3-30B-A3B-geometry K4 synthetic checkpoint, in two calls on one warm machine (the two builds'
# bundles do not fit one call's carry).
#   bash bench/run_prefill_attention_on_device.sh OUT before BUNDLE   (the previous build's exl3)
#   bash bench/run_prefill_attention_on_device.sh OUT after BUNDLE    (this build: GPU tests too)
# Each step: `exl3 bench model` at batch 1 with a 2k prefill and --profile (per-op shares of the
# prefill), then one 32k-token prompt (chunks of --max-batch-tokens 2048 against the growing
# cache). `after` then reruns the previous build's 2k prefill (kept in /tmp by `before`) so both
# builds have two rounds, and times decode at 1k / 8k / 32k tokens of context (batch 1 and 8).
set -uo pipefail
out="$1"; which="$2"; bundle="$3"
mkdir -p "$out"
model=/tmp/q30-k4
if [ "$which" = before ]; then
  mkdir -p /tmp/before && (cd /tmp/before && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('.')" "$OLDPWD/$bundle") || exit 1
  source bench/device_env.sh /tmp/before/.devbundle || exit 1
else
  source bench/device_env.sh "$bundle" || exit 1
  gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
fi
start=$(date +%s)
synthetic $model "$out/prepare_q30.txt" qwen3-30b-a3b --bits 4
echo "== prepare q30 rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
# prefill2k EXE TAG: batch 1 and a 2k prefill, profiled.
prefill2k() {
  timeout 200 "$1" bench model $model --batch 1 --prefill 2048 --profile \
    --json "$out/q30_prefill2k_$2.json" > "$out/q30_prefill2k_$2.txt" 2>&1
  echo "== $2 rc=$?: exl3 bench model $model --batch 1 --prefill 2048 --profile" | tee -a "$out/summary.txt"
  grep -E "^ +[0-9]+ |prefill|attention|moe|linear" "$out/q30_prefill2k_$2.txt" | tee -a "$out/summary.txt"
}
# prefill32k EXE TAG: one 32k prompt, 2k tokens per pass.
prefill32k() {
  timeout 280 "$1" bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048 \
    --json "$out/q30_prefill32k_$2.json" > "$out/q30_prefill32k_$2.txt" 2>&1
  echo "== $2 rc=$?: exl3 bench model $model --batch 1 --steps 4 --prefill 32768 --max-batch-tokens 2048" \
    | tee -a "$out/summary.txt"
  grep -E "prefill" "$out/q30_prefill32k_$2.txt" | tee -a "$out/summary.txt"
}
if [ "$which" = before ]; then
  prefill2k "$bin/exl3" before_r1
  prefill32k "$bin/exl3" before
  exit 0
fi
prefill2k "$bin/exl3" after_r1
prefill32k "$bin/exl3" after
[ -x /tmp/before/.devbundle/bin/exl3 ] && prefill2k /tmp/before/.devbundle/bin/exl3 before_r2
prefill2k "$bin/exl3" after_r2
for ctx in 1024 8192 32768; do
  timeout 200 "$bin/exl3" bench model $model --batch 1,8 --context $ctx --steps 16 --prefill 0 \
    --max-batch-tokens 8192 --json "$out/q30_ctx${ctx}.json" > "$out/q30_ctx${ctx}.txt" 2>&1
  echo "== context $ctx rc=$?: exl3 bench model $model --batch 1,8 --context $ctx --steps 16 --prefill 0 --max-batch-tokens 8192" \
    | tee -a "$out/summary.txt"
  grep -E "^ +[0-9]+ " "$out/q30_ctx${ctx}.txt" | tee -a "$out/summary.txt"
done
