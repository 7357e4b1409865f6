#!/usr/bin/env bash
# On the GPU machine: greedy ids picked on the GPU (Engine::forward_batch_argmax). Runs every GPU
# test binary of the bundle, then on the Qwen3-30B-A3B-geometry K4 checkpoint (written to
# /tmp/q30-k4 unless there): `exl3 bench model` at batch 1, 8, 64 and prefill 2048 (each decode
# figure with ids back and, on interleaved steps, with logits rows back), `exl3 bench model --draft-tokens 3` at
# batch 1 and 8 (speculative rounds, plain rounds and the adaptive policy with a useless draft),
# and `exl3 generate` greedy on the conformance model (GPU ids) against the CPU engine.
# Each `bench model` runs twice with programmatic dependent launch (default) and twice without
# (EXL3_PDL=0), alternating. Needs .devpack/bundle.tar.xz (with exl3 and the cuda_*_test binaries) and .conf/.
# Usage: bash bench/run_greedy_ids_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
m=.conf/models/tiny-qwen3moe-exl3
args="--prompt 'The quick brown fox' -n 48 --ignore-eos --json"
eval timeout 60 "$bin/exl3" generate $m $args --device cuda > "$out/generate_cuda.json" 2> "$out/generate_cuda.err"
eval timeout 120 "$bin/exl3" generate $m $args --device cpu > "$out/generate_cpu.json" 2> "$out/generate_cpu.err"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
g = json.load(open(sys.argv[1] + "/generate_cuda.json")); c = json.load(open(sys.argv[1] + "/generate_cpu.json"))
print("generate greedy: cuda ids == cpu ids:", g["ids"] == c["ids"], len(g["ids"]))
PY
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
# Programmatic dependent launch on (default) and off (EXL3_PDL=0), alternating, twice each.
for r in 1 2; do
  for pdl in 1 0; do
    EXL3_PDL=$pdl timeout 200 "$bin/exl3" bench model "$model" --batch 1,8,64 --prefill 2048 \
      --steps 64 --json "$out/bench_decode_pdl${pdl}_r$r.json" > "$out/bench_decode_pdl${pdl}_r$r.txt" 2>&1
    echo "bench decode EXL3_PDL=$pdl run $r rc=$?" | tee -a "$out/summary.txt"
    grep -E "^ +(batch|[0-9]+) |^prefill" "$out/bench_decode_pdl${pdl}_r$r.txt" | tee -a "$out/summary.txt"
  done
done
timeout 240 "$bin/exl3" bench model "$model" --batch 1,8 --prefill 0 --steps 64 --draft-tokens 3 \
  --json "$out/bench_speculative.json" > "$out/bench_speculative.txt" 2>&1
echo "speculative bench rc=$?" | tee -a "$out/summary.txt"
sed -n '/^speculative/,$p' "$out/bench_speculative.txt" | tee -a "$out/summary.txt"
# Nsight Compute on one batch-1 decode step of a 2-layer cut: the dense and MoE trellis GEMVs
# (duration, occupancy, warp stall reasons, memory throughput), for #16's GEMV work.
cut=/tmp/q30-k4-l2
synthetic "$cut" "$out/prepare_cut.txt" qwen3-30b-a3b --bits 4 --layers 2
timeout 200 ncu --clock-control none --graph-profiling node -k regex:'gemv' --launch-count 8 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  "$bin/exl3" bench model "$cut" --batch 1 --steps 1 --context 16 --prefill 0 \
  > "$out/ncu_gemv_b1.txt" 2> "$out/ncu_gemv_b1.err"
echo "ncu gemv rc=$? lines=$(wc -l < "$out/ncu_gemv_b1.txt")" | tee -a "$out/summary.txt"
