#!/usr/bin/env bash
# On the GPU machine: multi-head latent attention on the CUDA engine (DeepSeek-V3 and GLM-5 with
# the DSA indexer, the reference checkpoints of tests/model/data with EXL3 experts and as
# `exl3 quantize` converts them) against the CPU engine, the DSA top-k kernel, then every GPU test
# of the bundle. Usage: bash bench/run_mla_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
start=$(date +%s)
timeout 300 "$bin/cuda_mla_engine_test" > "$out/mla.log" 2>&1
echo "cuda_mla_engine_test rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
grep -E "rel-L2|FAILED|PASSED|Failure|Expected|Which is|error" "$out/mla.log" | head -60 | tee -a "$out/summary.txt"
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
