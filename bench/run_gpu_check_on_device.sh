#!/usr/bin/env bash
# On the GPU machine: unpack the carried test/bench bundle (.devpack/bundle.tar.xz, made by
# scripts/device_bundle.sh then `tar -cf - .devbundle | xz`), run every GPU test binary into one
# log, then `exl3 bench model` on the Qwen3-30B-A3B-geometry synthetic model at the given bits.
# Needs .conf/ (the conformance folder). Usage: bash bench/run_gpu_check_on_device.sh OUT_DIR [BITS...]
set -uo pipefail
out="$1"; shift
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
for bits in "$@"; do
  timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" --out "/tmp/q30-k$bits" \
    --batch 1,8,64 --prefill 2048 --json "$out/bench_model_qwen3_30b_a3b_k$bits.json" > "$out/bench_k$bits.txt" 2>&1
  echo "bench k$bits rc=$?" | tee -a "$out/summary.txt"
  tail -n 12 "$out/bench_k$bits.txt"
  rm -rf "/tmp/q30-k$bits"
done
