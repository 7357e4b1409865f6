#!/usr/bin/env bash
# On a GPU machine (nvidia-h200-x2 for TP 2): the GPU tests that cover tensor parallelism and the
# CUDA engine, then Qwen3-30B-A3B-geometry synthetic K4 decode/prefill at TP 1 and TP 2 with the
# collectives' share. The synthetic model is written on the CPU while the GPU tests run.
# Needs .devbundle/ (scripts/device_bundle.sh BUILD exl3 <tests>) and .conf/ (conformance folder).
# Usage: bash bench/run_tp_on_device.sh OUT_DIR [TESTS...]   (at most 8 files come back: logs are merged;
#   LATE_TESTS="a b" run after the benchmarks; MXFP8_BENCH=1 also runs exl3_bench_mxfp8 after the
#   tests, while the model is still being written; MXFP8_VARIANTS="ARGS;ARGS" then runs it once per
#   argument list, text output only, e.g. "--unroll 8 --m 1,8;--split-k 1 --m 1")
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
if [ "${MXFP8_BENCH:-0}" = 1 ]; then
  start=$(date +%s)
  timeout 150 "$bin/exl3_bench_mxfp8" --json "$out/mxfp8.json" > "$out/mxfp8.log" 2>&1
  echo "exl3_bench_mxfp8 rc=$? $(( $(date +%s) - start ))s" | tee -a "$log"
  IFS=';' read -r -a variants <<< "${MXFP8_VARIANTS:-}"
  for i in "${!variants[@]}"; do
    start=$(date +%s)
    # shellcheck disable=SC2086  # the variant is a list of arguments
    timeout 120 "$bin/exl3_bench_mxfp8" ${variants[$i]} > "$out/mxfp8_variant$i.txt" 2>&1
    echo "exl3_bench_mxfp8 ${variants[$i]} rc=$? $(( $(date +%s) - start ))s" | tee -a "$log"
  done
fi
wait $writer
echo "writer rc=$?" | tee -a "$out/bench.log"
# The first run (2026-11-29) spent its 110 s benchmark steps loading: read the file once, timed,
# so the page cache holds it and the load time is known.
start=$(date +%s%N)
cat "$model"/*.safetensors > /dev/null
echo "read $(du -sh "$model" | cut -f1) in $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$out/bench.log"
# A watchdog samples the benchmark every 15 s (state, CPU, wait channel, GPU use), so a slow or
# stuck step shows where its time goes.
watch_pid() {
  while kill -0 "$1" 2>/dev/null; do
    sleep 15
    { echo "[watch $(date +%T)] $(ps -o stat=,pcpu=,rss=,etime=,wchan:24= -p "$1" 2>/dev/null)";
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null; } >> "$out/bench.log"
  done
}
# TP_REPEATS=N alternates TP 1 and TP 2 N times (run-to-run spread; the JSON keeps the last).
for rep in $(seq 1 "${TP_REPEATS:-1}"); do
for tp in 1 2; do
  start=$(date +%s)
  timeout ${BENCH_SECONDS:-240} "$bin/exl3" bench model "$model" --tp $tp --batch 1,8,64 --steps 16 --prefill 2048 \
    --json "$out/bench_model_qwen3_30b_a3b_k4_tp$tp.json" >> "$out/bench.log" 2>&1 &
  pid=$!
  watch_pid $pid &
  wait $pid
  echo "bench tp $tp (repeat $rep) rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/bench.log"
done
done
for t in ${LATE_TESTS:-}; do
  echo "=== $t" >> "$log"
  start=$(date +%s)
  timeout 80 "$bin/$t" --gtest_brief=1 >> "$log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - start ))s" | tee -a "$log"
done
