#!/usr/bin/env bash
# On the GPU machine: the bundled GPU tests (prefix reuse with gated DeltaNet layers among them),
# then decode speed of an 8-layer Qwen3-Next-80B-A3B K4 synthetic checkpoint in exl3 and in
# exllamav3 1.6.5 (its Generator; needs .peer/ as bench/peers/run_model_peer_on_device.sh says,
# with flash-linear-attention and fla-core, which exllamav3 needs for this architecture).
# The peer's extension builds (minutes) while exl3 prepares and benchmarks the checkpoint; then
# `exl3 bench serve` on the same checkpoint with the prefix cache off and on (the recurrent
# state kept at page boundaries). PEER=0 leaves exllamav3 out.
# Usage: [PEER=0] bash bench/run_hybrid_peer_on_device.sh BUNDLE.tar.xz OUT
set -uo pipefail
bundle="$1" out="$2"
mkdir -p "$out"
source bench/device_env.sh "$bundle" || exit 1
peer=${PEER:-1}
if [ "$peer" = 1 ]; then
  bash bench/peers/run_model_peer_on_device.sh --build-only "$out/peer_build" > "$out/peer_build.log" 2>&1 &
  build=$!
fi
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
m=/tmp/qwen3-next-l8-k4
start=$(date +%s)
synthetic $m "$out/prepare_next.txt" qwen3-next-80b-a3b --layers 8 --bits 4
echo "== prepare qwen3-next rc=$? $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
timeout 200 "$bin/exl3" bench model $m --batch 1,8 --prefill 2048 \
  --json "$out/exl3_qwen3_next_l8_k4.json" > "$out/exl3_qwen3_next_l8_k4.txt" 2>&1
echo "== exl3 rc=$?: exl3 bench model $m --batch 1,8 --prefill 2048" | tee -a "$out/summary.txt"
grep -E "^ +[0-9]+ |prefill" "$out/exl3_qwen3_next_l8_k4.txt" | tee -a "$out/summary.txt"
python3 bench/write_synthetic_tokenizer.py $m
timeout 240 "$bin/exl3" bench serve $m --device cuda --concurrency 1,32 --requests 32 \
  --prompt-tokens 512 --max-tokens 64 --shared-fraction 0.75 --prefix-cache both \
  --json "$out/serve_bench_qwen3_next.json" > "$out/serve_bench_qwen3_next.txt" 2> "$out/serve_bench_qwen3_next.err"
echo "== exl3 bench serve rc=$?: exl3 bench serve $m --device cuda --concurrency 1,32 --requests 32 --prompt-tokens 512 --max-tokens 64 --shared-fraction 0.75 --prefix-cache both" | tee -a "$out/summary.txt"
tee -a "$out/summary.txt" < "$out/serve_bench_qwen3_next.txt"
tail -n 5 "$out/serve_bench_qwen3_next.err" >> "$out/summary.txt"
[ "$peer" = 1 ] || exit 0
wait $build
echo "== exllamav3 build rc=$? $(cat "$out/peer_build/exllamav3_build_time.txt" 2>/dev/null)" | tee -a "$out/summary.txt"
timeout 240 bash bench/peers/run_model_peer_on_device.sh $m "$out/peer" > "$out/peer.log" 2>&1
echo "== exllamav3 rc=$?: bench/peers/exllamav3_model.py --model $m --batch 1,8" | tee -a "$out/summary.txt"
tail -n 20 "$out/peer.log" >> "$out/summary.txt"
