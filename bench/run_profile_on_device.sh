#!/usr/bin/env bash
# On the GPU machine: every GPU test binary of the bundle, then `exl3 bench model --profile` on
# the Qwen3-30B-A3B-geometry K4 checkpoint (batch 1, 8, 64: the timed decode steps, then one
# eager step per batch with every op class timed) and on the DeepSeek-V3-geometry 5-layer cut
# (MLA; batch 1, 8); then `exl3 serve` on the conformance model with --device cuda and a small KV
# pool under bench/serve_smoke.py (concurrent greedy streams equal solo ones, structured output
# replies parse and fit their schema). Needs .devpack/bundle.tar.xz and .conf/.
# Usage: bash bench/run_profile_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
timeout 200 "$bin/exl3" bench model "$model" --batch 1,8,64 --prefill 0 --steps 64 --profile \
  --json "$out/profile_q30.json" > "$out/profile_q30.txt" 2>&1
echo "qwen3-30b-a3b profile rc=$?" | tee -a "$out/summary.txt"
cat "$out/profile_q30.txt" | grep -v "^loading\|^loaded\|layer " | tee -a "$out/summary.txt"
ds=/tmp/dsv3-l5-k4
synthetic "$ds" "$out/prepare_dsv3.txt" deepseek-v3 --layers 5 --bits 4
timeout 200 "$bin/exl3" bench model "$ds" --batch 1,8 --prefill 0 --steps 64 --profile \
  --json "$out/profile_dsv3.json" > "$out/profile_dsv3.txt" 2>&1
echo "deepseek-v3 5 layers profile rc=$?" | tee -a "$out/summary.txt"
cat "$out/profile_dsv3.txt" | grep -v "^loading\|^loaded\|layer " | tee -a "$out/summary.txt"
"$bin/exl3" serve .conf/models/tiny-qwen3moe-exl3 --device cuda --port 8123 --cache-tokens 160 \
  > "$out/serve_cuda.log" 2>&1 &
serve_pid=$!
timeout 240 python3 bench/serve_smoke.py --port 8123 > "$out/serve_smoke.json" 2>&1
echo "serve smoke (cuda, structured output, small KV pool) rc=$?" | tee -a "$out/summary.txt"
kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null
(cd "$out" && tar -cJf ../profile_files.tar.xz --exclude summary.txt *)
