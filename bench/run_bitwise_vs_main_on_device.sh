#!/usr/bin/env bash
# GPU tests of a branch, then its exl3 against main's bit for bit (same model, same tokens) on every
# linear path, and smoke runs of the benches. On the GPU machine, with the bundle
# (scripts/device_bundle.sh: the cuda_*_test binaries, exl3, exl3_bench_gemm and exl3_bench_mxfp8,
# plus main's exl3 copied in as exl3_main) in .devpack/cuda-hygiene/bundle.tar.xz and the
# conformance folder in .conf/ (both carried). Usage: OUT=dir bash bench/run_bitwise_vs_main_on_device.sh
# Logits: 300 tokens (EXL3 and MXFP8 linears on the cuBLAS path), 5 (GEMV), 40 (MMA / MXFP8 cuBLAS).
set -uo pipefail
out="$OUT"
source bench/device_env.sh .devpack/cuda-hygiene/bundle.tar.xz || exit 1
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
M=.conf/models/tiny-qwen3moe-exl3
T300=$(python3 -c "print(','.join(str((i*37+11)%512) for i in range(300)))")
T5=$(python3 -c "print(','.join(str((i*53+7)%512) for i in range(5)))")
T40=$(python3 -c "print(','.join(str((i*91+3)%512) for i in range(40)))")
cmpf() {  # name a b: the logits tensors bit for bit
  python3 - "$1" "$2" "$3" <<'PY' | tee -a "$OUT/summary.txt"
import sys
from safetensors.numpy import load_file
n, a, b = sys.argv[1:]
x, y = load_file(a)["logits"], load_file(b)["logits"]
same = x.shape == y.shape and x.tobytes() == y.tobytes()
print(f"bitwise {n}: {'SAME' if same else 'DIFF'} shape {x.shape} max|d| {abs(x - y).max() if x.shape == y.shape else 'n/a'}")
PY
}
for b in exl3 exl3_main; do
  "$bin/$b" logits $M --tokens $T300 --device cuda -o /tmp/${b}_300.st > /dev/null 2>>"$out/err.txt"
  "$bin/$b" logits $M --tokens $T5 --device cuda -o /tmp/${b}_5.st > /dev/null 2>>"$out/err.txt"
  "$bin/$b" logits $M --tokens $T40 --device cuda -o /tmp/${b}_40.st > /dev/null 2>>"$out/err.txt"
  "$bin/$b" logits $M --tokens $T300 --device cuda --overlay linear=mxfp8 -o /tmp/${b}_300mx.st > /dev/null 2>>"$out/err.txt"
  "$bin/$b" logits $M --tokens $T40 --device cuda --overlay linear=mxfp8 -o /tmp/${b}_40mx.st > /dev/null 2>>"$out/err.txt"
  "$bin/$b" generate $M -p "hello there, how are you" -n 64 --ignore-eos --device cuda > /tmp/${b}_gen.txt 2>>"$out/err.txt"
  "$bin/$b" generate $M -p "hello there, how are you" -n 64 --ignore-eos --device cuda --overlay linear=mxfp8 > /tmp/${b}_genmx.txt 2>>"$out/err.txt"
done
for c in 300 5 40 300mx 40mx; do cmpf "logits m=$c" /tmp/exl3_$c.st /tmp/exl3_main_$c.st; done
for g in gen genmx; do
  head -c 2000 /tmp/exl3_$g.txt > "$out/branch_$g.txt"; head -c 2000 /tmp/exl3_main_$g.txt > "$out/main_$g.txt"
done
echo "--- bench smoke" >> "$out/summary.txt"
timeout 120 "$bin/exl3_bench_gemm" --shapes 4096x4096 --bits 4 --m 1,256 --reps 5 --hadamard "" > "$out/bench_gemm.txt" 2>&1; echo "bench_gemm rc=$?" | tee -a "$out/summary.txt"
timeout 120 "$bin/exl3_bench_mxfp8" --shapes 4096x4096 --m 1,256 --reps 5 > "$out/bench_mxfp8.txt" 2>&1; echo "bench_mxfp8 rc=$?" | tee -a "$out/summary.txt"
timeout 120 "$bin/exl3" moe-bench --geometry qwen3-30b-a3b --tiers 4 --m 1,64 --reps 5 > "$out/moe_bench.txt" 2>&1; echo "moe_bench rc=$?" | tee -a "$out/summary.txt"
echo DONE | tee -a "$out/summary.txt"
