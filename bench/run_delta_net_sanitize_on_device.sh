#!/usr/bin/env bash
# On the GPU machine: the gated DeltaNet kernel test under compute-sanitizer (racecheck for the
# shared-memory hazards of the chunked kernel, then memcheck), each bounded to LIMIT seconds.
# Usage: bash bench/run_delta_net_sanitize_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck memcheck; do
  start=$(date +%s)
  timeout ${LIMIT:-150} "$san" --tool $tool --error-exitcode 3 "$bin/cuda_delta_net_test" \
    --gtest_brief=1 > "$out/delta_net_$tool.log" 2>&1
  echo "== compute-sanitizer --tool $tool cuda_delta_net_test rc=$? $(( $(date +%s) - start ))s" \
    | tee -a "$out/summary.txt"
  tail -n 4 "$out/delta_net_$tool.log" | tee -a "$out/summary.txt"
done
