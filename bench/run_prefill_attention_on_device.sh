#!/usr/bin/env bash
# On the GPU machine: prefill before and after the tensor-core prefill attention, on one
# Qwen3-30B-A3B-geometry K4 synthetic checkpoint, in two calls on one warm machine (the two builds'
# bundles do not fit one call's carry; each is unpacked under /tmp, which a warm machine keeps).
#   bash bench/run_prefill_attention_on_device.sh OUT after BUNDLE    (this build: GPU tests too)
#   bash bench/run_prefill_attention_on_device.sh OUT before BUNDLE   (the previous build's exl3)
# Each build: `exl3 bench model` at batch 1 with a 2k prefill and --profile (per-op shares of the
# prefill), then one 32k-token prompt (chunks of --max-batch-tokens 2048 against the growing
# cache). `after` also times decode at 1k / 8k / 32k tokens of context (batch 1 and 8); `before`
# then reruns this build's 2k prefill, so each build has two rounds, alternating.
set -uo pipefail
out="$1"; which="$2"; bundle="$3"
mkdir -p "$out"
model=/tmp/q30-k4
rm -rf "/tmp/$which" && mkdir -p "/tmp/$which"
(cd "/tmp/$which" && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('.')" "$OLDPWD/$bundle") || exit 1
source bench/device_env.sh "/tmp/$which/.devbundle" || exit 1
[ "$which" = after ] && gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
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
if [ "$which" = after ]; then
  prefill2k "$bin/exl3" after_r1
  prefill32k "$bin/exl3" after
  for ctx in 1024 8192 32768; do
    timeout 200 "$bin/exl3" bench model $model --batch 1,8 --context $ctx --steps 16 --prefill 0 \
      --max-batch-tokens 8192 --json "$out/q30_ctx${ctx}.json" > "$out/q30_ctx${ctx}.txt" 2>&1
    echo "== context $ctx rc=$?: exl3 bench model $model --batch 1,8 --context $ctx --steps 16 --prefill 0 --max-batch-tokens 8192" \
      | tee -a "$out/summary.txt"
    grep -E "^ +[0-9]+ " "$out/q30_ctx${ctx}.txt" | tee -a "$out/summary.txt"
  done
else
  prefill2k "$bin/exl3" before_r1
  prefill32k "$bin/exl3" before
  [ -x /tmp/after/.devbundle/bin/exl3 ] && prefill2k /tmp/after/.devbundle/bin/exl3 after_r2
  prefill2k "$bin/exl3" before_r2
fi
