#!/usr/bin/env bash
# On the GPU machine: the GPU test suite, then the model and MoE benchmarks. Needs, carried from
# the dev machine: .devbundle/ (scripts/device_bundle.sh BUILD exl3 <gpu tests>) and .conf/ (the
# conformance folder). Usage: bash bench/run_engine_on_device.sh OUT_DIR [tests|bench|all]
set -uo pipefail
out="$1"
what="${2:-all}"
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64 EXL3_CONFORMANCE_DIR=$PWD/.conf
bin=$PWD/.devbundle/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$out/gpu.txt" 2>&1

if [ "$what" != bench ]; then
  for t in "$bin"/cuda_*_test "$bin"/runtime_test; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    timeout 300 "$t" --gtest_brief=1 > "$out/$name.txt" 2>&1
    echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.txt" | tr '\n' ' ')"
  done
fi

if [ "$what" != tests ]; then
  for bits in 4 3; do
    timeout 420 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" --out "/tmp/q30-k$bits" \
      --batch 1,8,64 --prefill 2048 --json "$out/bench_model_qwen3_30b_a3b_k$bits.json" 2>&1 | tee "$out/bench_model_k$bits.txt"
    rm -rf "/tmp/q30-k$bits"
  done
fi
