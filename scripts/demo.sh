#!/usr/bin/env bash
# The `make demo` job: write a small synthetic EXL3 checkpoint with exl3's own writer, inspect it,
# run one layer through the CPU reference path, and decode another to its weights.
set -euo pipefail
exl3="$1"
out="$2"
rm -rf "$out"
echo "== 1. exl3 sample: a 2-layer Qwen3-MoE-shaped EXL3 checkpoint (random valid trellis, K=4 mul1)"
"$exl3" sample "$out/model" --bits 4 --codebook mul1 --seed 42
echo
echo "== 2. exl3 inspect: every EXL3 linear, validated, with its K, codebook and size"
"$exl3" inspect "$out/model" | sed -n '1,14p'
echo "   ..."
"$exl3" inspect "$out/model" | tail -n 6
echo
echo "== 3. exl3 linear: y = had(had(x*suh) @ W_hat) * svh on the sample input (fp32 accumulation)"
"$exl3" linear "$out/model" --prefix model.layers.0.self_attn.q_proj \
  --input "$out/model/sample_input.safetensors" --out "$out/y.safetensors"
echo
echo "== 4. exl3 dequant: the lm_head weight in the original basis (F32) and W_hat (F16)"
"$exl3" dequant "$out/model" --prefix lm_head --out "$out/lm_head.safetensors"
echo
echo "demo done: files in $out/ (try: $exl3 inspect $out/model --json)"
