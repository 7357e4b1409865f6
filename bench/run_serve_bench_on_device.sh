#!/usr/bin/env bash
# On the GPU machine: `exl3 bench serve` on the Qwen3-30B-A3B-geometry K4 checkpoint with the
# CUDA engine, at 1, 8 and 64 concurrent streams (512-token prompts, three quarters of them a
# shared system prefix, 128 tokens generated, ignore_eos), with the prefix cache off and then on:
# TTFT and ITL p50/p99, output tokens/s, requests/s and prefix-cache hits per level. The
# synthetic checkpoint has no tokenizer, so bench/write_synthetic_tokenizer.py writes one first. Needs .devpack/bundle.tar.xz, or the bundle that
# `run_kv_cache_on_device.sh tests` unpacked into /tmp/kv on a machine still warm (whose `speed`
# phase also leaves the synthetic checkpoint in /tmp/q30-k4).
# Usage: bash bench/run_serve_bench_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
bundle=.devpack/bundle.tar.xz
[ -f "$bundle" ] || bundle=/tmp/kv/.devbundle
source bench/device_env.sh "$bundle" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
python3 bench/write_synthetic_tokenizer.py "$model"
echo "tokenizer written rc=$?" | tee -a "$out/summary.txt"
timeout 560 "$bin/exl3" bench serve "$model" --device cuda --concurrency 1,8,64 \
  --prompt-tokens 512 --max-tokens 128 --shared-fraction 0.75 --prefix-cache both \
  --json "$out/serve_bench_q30.json" > "$out/serve_bench_q30.txt" 2> "$out/serve_bench_q30.err"
echo "qwen3-30b-a3b bench serve rc=$?" | tee -a "$out/summary.txt"
tee -a "$out/summary.txt" < "$out/serve_bench_q30.txt"
tail -n 20 "$out/serve_bench_q30.err" >> "$out/summary.txt"
