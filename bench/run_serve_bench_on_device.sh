#!/usr/bin/env bash
# On the GPU machine: `exl3 bench serve` on the Qwen3-30B-A3B-geometry K4 checkpoint with the
# CUDA engine, at 1, 8 and 64 concurrent streams (512-token prompts, three quarters of them a
# shared system prefix, 128 tokens generated, ignore_eos), with the prefix cache off and then on:
# TTFT and ITL p50/p99, output tokens/s, requests/s and prefix-cache hits per level. The
# synthetic checkpoint has no tokenizer, so one is written beside it first: a byte-level BPE
# vocabulary of the model's size (3 special tokens, the 256 bytes, then plain filler tokens), which
# decodes every id the model can produce. Needs .devpack/bundle.tar.xz, or the bundle that
# `run_kv_cache_on_device.sh tests` unpacked into /tmp/kv on a machine still warm (whose `speed`
# phase also leaves the synthetic checkpoint in /tmp/q30-k4).
# Usage: bash bench/run_serve_bench_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
bundle=.devpack/bundle.tar.xz
[ -f "$bundle" ] || bundle=/tmp/kv/.devbundle
source bench/device_env.sh "$bundle" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
model=/tmp/q30-k4
synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
python3 - "$model" <<'PY'
import json, os, sys
d = sys.argv[1]
vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
def byte_char(b):  # GPT-2's byte-to-unicode alphabet
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in keep:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(keep)).index(b))
specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
v = {s: i for i, s in enumerate(specials)}
for b in range(256):
    v[byte_char(b)] = 3 + b
for i in range(259, vocab):
    v[f"w{i}"] = i
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": False, "special": True}
                        for i, s in enumerate(specials)],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True},
       "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None,
                 "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": v, "merges": []}}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
           "tokenizer_class": "PreTrainedTokenizerFast"},
          open(os.path.join(d, "tokenizer_config.json"), "w"))
PY
echo "tokenizer written rc=$?" | tee -a "$out/summary.txt"
timeout 560 "$bin/exl3" bench serve "$model" --device cuda --concurrency 1,8,64 \
  --prompt-tokens 512 --max-tokens 128 --shared-fraction 0.75 --prefix-cache both \
  --json "$out/serve_bench_q30.json" > "$out/serve_bench_q30.txt" 2> "$out/serve_bench_q30.err"
echo "qwen3-30b-a3b bench serve rc=$?" | tee -a "$out/summary.txt"
tee -a "$out/summary.txt" < "$out/serve_bench_q30.txt"
tail -n 20 "$out/serve_bench_q30.err" >> "$out/summary.txt"
