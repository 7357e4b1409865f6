#!/usr/bin/env bash
# On the GPU machine: decode and prefill speed of the DeepSeek-V3 geometry (MLA with the latent
# cache, 256 experts top-8 with grouped routing, a shared expert) through the CUDA engine, on a
# synthetic K4 checkpoint cut to its first 5 layers (3 dense + 2 MoE; random valid trellis bits,
# a speed benchmark only). Usage: bash bench/run_deepseek_bench_on_device.sh OUT [tests]
# (`tests`: first the bundle's cuda_mla_engine_test and cuda_engine_test)
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
m=/tmp/dsv3-l5-k4
if [ "${2:-}" = "tests" ]; then  # the MLA GPU tests of the bundle first
  for t in "$bin"/cuda_mla_engine_test "$bin"/cuda_engine_test; do
    timeout 200 "$t" > "$out/$(basename "$t").log" 2>&1
    echo "$(basename "$t") rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/$(basename "$t").log" | tail -n 1)" | tee -a "$out/summary.txt"
  done
  grep -h "rel-L2" "$out"/cuda_mla_engine_test.log | tee -a "$out/summary.txt"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
run() {  # NAME ARGS...: one bench invocation, its table and exit status into the summary
  local name="$1"; shift
  local start=$(date +%s)
  timeout 240 "$bin/exl3" bench model "$@" --json "$out/$name.json" > "$out/$name.txt" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - start ))s: exl3 bench model $*" | tee -a "$out/summary.txt"
  tail -n 12 "$out/$name.txt" | tee -a "$out/summary.txt"
}
run prepare --synthetic deepseek-v3 --layers 5 --bits 4 --out $m --prepare-only
run ctx128 $m --batch 1,8,64 --prefill 2048
run ctx1k $m --batch 1,8 --context 1024 --steps 16 --prefill 0
run ctx8k $m --batch 1,8 --context 8192 --steps 8 --prefill 0
