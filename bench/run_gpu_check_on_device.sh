#!/usr/bin/env bash
# On the GPU machine: unpack the carried test/bench bundle (.devpack/bundle.tar.xz, made by
# scripts/device_bundle.sh then `tar -cf - .devbundle | xz`), run every GPU test binary into one
# log, then `exl3 bench model` on the Qwen3-30B-A3B-geometry synthetic model at the given bits.
# Needs .conf/ (the conformance folder). Usage: bash bench/run_gpu_check_on_device.sh OUT_DIR [BITS...]
set -uo pipefail
out="$1"; shift
mkdir -p "$out"
python3 -c "import tarfile; tarfile.open('.devpack/bundle.tar.xz').extractall('.')" || exit 1
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64:${nccl:-} EXL3_CONFORMANCE_DIR=$PWD/.conf
export NCCL_NVLS_ENABLE=0
bin=$PWD/.devbundle/bin
log="$out/gpu_tests.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$log" 2>&1
for t in "$bin"/cuda_*_test "$bin"/runtime_test; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  echo "=== $name" >> "$log"
  start=$(date +%s)
  timeout 240 "$t" --gtest_brief=1 >> "$log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tail -n 2 | tr '\n' ' ')" | tee -a "$out/summary.txt"
done
for bits in "$@"; do
  timeout 300 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits "$bits" --out "/tmp/q30-k$bits" \
    --batch 1,8,64 --prefill 2048 --json "$out/bench_model_qwen3_30b_a3b_k$bits.json" > "$out/bench_k$bits.txt" 2>&1
  echo "bench k$bits rc=$?" | tee -a "$out/summary.txt"
  tail -n 12 "$out/bench_k$bits.txt"
  rm -rf "/tmp/q30-k$bits"
done
