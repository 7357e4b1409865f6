#!/usr/bin/env bash
# On the GPU machine: the fp16 cache's decode attention on tensor cores (attention_decode_mma.cu)
# against the CUDA-core kernel it replaced, and the MoE grouped GEMM's second pipeline against the
# first, from one carried bundle (.devpack/bundle.tar.xz) holding
#   exl3                 this tree
#   exl3_before          the build before the attention change (the first MoE GEMM pipeline)
#   exl3_gemm2           that build with the second MoE GEMM pipeline (git revert 0ac16e6)
#   cuda_moe_gemm2_test  the MoE GPU tests of that build
# and this tree's GPU tests. Phases, in the order given:
#   tests      every bundled GPU test binary
#   moe        exl3 moe-bench, Qwen3-30B-A3B layer K4, groups of 128 (the grouped GEMM) at
#              m = 1024, 2048, 3072: exl3_before and exl3_gemm2 alternating, two rounds
#   ctx:C      decode at context C, batch 1 and 8, exl3_before then exl3
#              (bench/run_context_on_device.sh) on the Qwen3-30B-A3B-geometry K4 checkpoint
# Everything but summary.txt is packed into OUT/results.tgz (the device tool brings back few files).
# Usage: bash bench/run_decode_attention_on_device.sh OUT PHASE...
set -uo pipefail
out="$1"; shift
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
export bin
for phase in "$@"; do
  case "$phase" in
    tests)
      gpu_tests "$out/gpu_tests.log" "$out/summary.txt" ;;
    moe)
      for round in 1 2; do
        for build in before gemm2; do
          tag=moe_q30_k4_group128_${build}_r$round
          extra=--no-baseline; [ "$round" = 1 ] && [ "$build" = before ] && extra=
          EXL3_MOE_PREFILL_GROUP=128 timeout 200 "$bin/exl3_$build" moe-bench \
            --geometry qwen3-30b-a3b --tiers 4 --layout per_expert --m 1024,2048,3072 --reps 10 \
            $extra --json "$out/$tag.json" > "$out/$tag.txt" 2>&1
          echo "== $tag rc=$?: EXL3_MOE_PREFILL_GROUP=128 exl3_$build moe-bench --geometry qwen3-30b-a3b --tiers 4 --layout per_expert --m 1024,2048,3072 --reps 10 $extra" \
            | tee -a "$out/summary.txt"
          grep -E "^m=" "$out/$tag.txt" | tee -a "$out/summary.txt"
        done
      done ;;
    ctx:*)
      bash bench/run_context_on_device.sh "$out" 4 "${phase#ctx:}" ;;
    *)
      echo "unknown phase $phase" | tee -a "$out/summary.txt" ;;
  esac
done
(cd "$out" && tar -czf results.tgz --exclude=summary.txt --exclude=results.tgz . 2>/dev/null)
find "$out" -mindepth 1 ! -name summary.txt ! -name results.tgz -delete
