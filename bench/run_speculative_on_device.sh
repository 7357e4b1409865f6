#!/usr/bin/env bash
# On the GPU machine: speculative decoding on the CUDA engine. (1) `exl3 generate --draft` on the
# conformance model (the model as its own draft) gives the same ids as plain greedy; (2)
# `exl3 bench model --draft-tokens 3` at batch 1 on the Qwen3-30B-A3B-geometry K4 checkpoint.
# Needs .devpack/bundle.tar.xz (with exl3) and .conf/. Usage: bash bench/run_speculative_on_device.sh OUT
set -uo pipefail
out="$1"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
m=.conf/models/tiny-qwen3moe-exl3
args="--prompt 'The quick brown fox' -n 32 --ignore-eos --device cuda --json"
eval timeout 60 "$bin/exl3" generate $m $args > "$out/plain.json" 2> "$out/plain.err"
eval timeout 60 "$bin/exl3" generate $m $args --draft $m --draft-tokens 3 > "$out/draft.json" 2> "$out/draft.err"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
p = json.load(open(sys.argv[1] + "/plain.json")); d = json.load(open(sys.argv[1] + "/draft.json"))
print("cuda generate --draft: ids equal to plain:", p["ids"] == d["ids"], len(p["ids"]), d["speculative"])
PY
timeout 150 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits 4 --out /tmp/q30-k4 --prepare-only > "$out/prepare.txt" 2>&1
timeout 120 "$bin/exl3" bench model /tmp/q30-k4 --batch 1 --prefill 0 --steps 32 --draft-tokens 3 \
  --json "$out/bench_speculative.json" > "$out/bench_speculative.txt" 2>&1
echo "bench rc=$?" | tee -a "$out/summary.txt"
tail -n 4 "$out/bench_speculative.txt" | tee -a "$out/summary.txt"
