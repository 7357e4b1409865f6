#!/usr/bin/env bash
# On the GPU machine, after bench/run_greedy_ids_on_device.sh: every GPU test binary of the
# bundle; `exl3 bench model` on the Qwen3-30B-A3B-geometry K4 checkpoint at batch 1, 8, 64 and
# prefill 2048; batch 64 with the fused MoE's decode path raised to 64 and 128 tokens
# (EXL3_MOE_DECODE_MAX_M; the default 32 sends batch 64 down the prefill path) and batch 8 with
# it lowered to 4 (batch 8 then takes the grouped prefill path); speculative
# decoding at batch 1 and 8 (the adaptive policy with a useless draft); Nsight Compute on the
# decode-shaped GEMVs (a 1-token context, so the first step already has decode shapes); and the
# DeepSeek-V3-geometry 5-layer cut (MLA) with programmatic dependent launch on and off.
# Needs .devpack/bundle.tar.xz and .conf/. Usage: bash bench/run_decode_followup_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
timeout 200 "$bin/exl3" bench model "$model" --batch 1,8,64 --prefill 2048 --steps 64 \
  --json "$out/bench_decode.json" > "$out/bench_decode.txt" 2>&1
echo "bench decode rc=$?" | tee -a "$out/summary.txt"
grep -E "^ +(batch|[0-9]+) |^prefill" "$out/bench_decode.txt" | tee -a "$out/summary.txt"
for mm in 32 64 128; do
  EXL3_MOE_DECODE_MAX_M=$mm timeout 200 "$bin/exl3" bench model "$model" --batch 64 --prefill 0 \
    --steps 64 --json "$out/bench_b64_moe_decode_max_m$mm.json" > "$out/bench_b64_moe_decode_max_m$mm.txt" 2>&1
  echo "batch 64, EXL3_MOE_DECODE_MAX_M=$mm rc=$?" | tee -a "$out/summary.txt"
  grep -E "^ +64 " "$out/bench_b64_moe_decode_max_m$mm.txt" | tee -a "$out/summary.txt"
done
# Batch 8 through the grouped (prefill) MoE path: routes of one expert share its decoded tiles.
EXL3_MOE_DECODE_MAX_M=4 timeout 200 "$bin/exl3" bench model "$model" --batch 8 --prefill 0 \
  --steps 64 --json "$out/bench_b8_moe_decode_max_m4.json" > "$out/bench_b8_moe_decode_max_m4.txt" 2>&1
echo "batch 8, EXL3_MOE_DECODE_MAX_M=4 rc=$?" | tee -a "$out/summary.txt"
grep -E "^ +8 " "$out/bench_b8_moe_decode_max_m4.txt" | tee -a "$out/summary.txt"
timeout 240 "$bin/exl3" bench model "$model" --batch 1,8 --prefill 0 --steps 64 --draft-tokens 3 \
  --json "$out/bench_speculative.json" > "$out/bench_speculative.txt" 2>&1
echo "speculative bench rc=$?" | tee -a "$out/summary.txt"
sed -n '/^speculative/,$p' "$out/bench_speculative.txt" | tee -a "$out/summary.txt"
cut=/tmp/q30-k4-l2
synthetic "$cut" "$out/prepare_cut.txt" qwen3-30b-a3b --bits 4 --layers 2
timeout 200 ncu --clock-control none --graph-profiling node -k regex:'gemv' --launch-count 4 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  "$bin/exl3" bench model "$cut" --batch 1 --steps 1 --context 1 --prefill 0 \
  > "$out/ncu_gemv_decode_b1.txt" 2> "$out/ncu_gemv_decode_b1.err"
echo "ncu gemv rc=$?" | tee -a "$out/summary.txt"
grep -E "^  void|Duration|DRAM Throughput|Registers Per|Achieved Active Warps|No Eligible|Grid Size" \
  "$out/ncu_gemv_decode_b1.txt" | tee -a "$out/summary.txt"
ds=/tmp/dsv3-l5-k4
synthetic "$ds" "$out/prepare_dsv3.txt" deepseek-v3 --layers 5 --bits 4
for pdl in 1 0; do
  EXL3_PDL=$pdl timeout 200 "$bin/exl3" bench model "$ds" --batch 1,8 --prefill 0 --steps 64 \
    --json "$out/bench_dsv3_pdl$pdl.json" > "$out/bench_dsv3_pdl$pdl.txt" 2>&1
  echo "deepseek-v3 5 layers, EXL3_PDL=$pdl rc=$?" | tee -a "$out/summary.txt"
  grep -E "^ +(batch|[0-9]+) " "$out/bench_dsv3_pdl$pdl.txt" | tee -a "$out/summary.txt"
done
(cd "$out" && tar -cJf ../followup_files.tar.xz --exclude summary.txt *)
