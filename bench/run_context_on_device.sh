#!/usr/bin/env bash
# On the GPU machine: decode at long context (split-KV attention), two builds alternating, on the
# Qwen3-30B-A3B-geometry synthetic checkpoint written by run_before_after_on_device.sh (or here).
# For each context C in CONTEXTS: `exl3 bench model --context C --batch 1,8 --prefill 0` with
# `exl3_before` then `exl3`. Usage: bash bench/run_context_on_device.sh OUT_DIR BITS CONTEXTS...
set -uo pipefail
out="$1"; bits="$2"; shift 2
mkdir -p "$out"
[ -n "${bin:-}" ] || { source bench/device_env.sh .devpack/bundle.tar.xz || exit 1; }
model=/tmp/q30-k$bits
[ -f "$model/config.json" ] || timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" \
  --out "$model" --prepare-only > "$out/prepare.txt" 2>&1
for ctx in "$@"; do
  for build in before after; do
    exe="$bin/exl3"; [ "$build" = before ] && exe="$bin/exl3_before"
    timeout 280 "$exe" bench model "$model" --batch 1,8 --context "$ctx" --steps 16 --prefill 0 \
      --max-batch-tokens 8192 --json "$out/ctx${ctx}_${build}.json" > "$out/ctx${ctx}_${build}.txt" 2>&1
    echo "context $ctx $build rc=$?" | tee -a "$out/summary.txt"
    grep -E "^ +[0-9]+ " "$out/ctx${ctx}_${build}.txt" | tee -a "$out/summary.txt"
  done
done
