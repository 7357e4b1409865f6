#!/usr/bin/env bash
# On a GPU machine (nvidia-h200-x2 for TP 2): the GPU tests that cover tensor parallelism and the
# CUDA engine, then Qwen3-30B-A3B-geometry synthetic K4 decode/prefill at TP 1 and TP 2 with the
# collectives' share. The synthetic model is written on the CPU while the GPU tests run.
# Needs .devbundle/ (scripts/device_bundle.sh BUILD exl3 <tests>) and .conf/ (conformance folder).
# Usage: bash bench/run_tp_on_device.sh OUT_DIR [TESTS...]   (at most 8 files come back: logs are merged;
#   LATE_TESTS="a b" run after the benchmarks)
set -uo pipefail
out="$1"; shift
mkdir -p "$out"
# NCCL comes from the image's nvidia-nccl wheel (or the toolkit); NVLink multicast stays off.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64:${nccl:-} EXL3_CONFORMANCE_DIR=$PWD/.conf
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=WARN
bin=$PWD/.devbundle/bin
log="$out/tests.log"
{ nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem --format=csv; nvidia-smi topo -m; echo "nccl lib: $nccl"; } > "$log" 2>&1
model=/tmp/q30-k4
( timeout 200 "$bin/exl3" bench model --synthetic qwen3-30b-a3b --bits 4 --out "$model" --prepare-only > "$out/bench.log" 2>&1 ) &
writer=$!
for t in "$@"; do
  echo "=== $t" >> "$log"
  start=$(date +%s)
  timeout 100 "$bin/$t" --gtest_brief=1 >> "$log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - start ))s" | tee -a "$log"
done
wait $writer
echo "writer rc=$?" | tee -a "$out/bench.log"
# The first run (2026-11-29) spent its 110 s benchmark steps loading: read the file once, timed,
# so the page cache holds it and the load time is known.
start=$(date +%s.%N)
cat "$model"/*.safetensors > /dev/null
echo "read $(du -sh "$model" | cut -f1) in $(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$out/bench.log"
for tp in 1 2; do
  start=$(date +%s)
  timeout ${BENCH_SECONDS:-240} "$bin/exl3" bench model "$model" --tp $tp --batch 1,8,64 --steps 16 --prefill 2048 \
    --json "$out/bench_model_qwen3_30b_a3b_k4_tp$tp.json" >> "$out/bench.log" 2>&1
  echo "bench tp $tp rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/bench.log"
done
for t in ${LATE_TESTS:-}; do
  echo "=== $t" >> "$log"
  start=$(date +%s)
  timeout 80 "$bin/$t" --gtest_brief=1 >> "$log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - start ))s" | tee -a "$log"
done
