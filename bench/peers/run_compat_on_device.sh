#!/usr/bin/env bash
# On the GPU machine: convert synthetic HF models with `exl3 quantize --device cuda`, then prove
# exllamav3 compatibility (bench/peers/exllamav3_compat.py). Needs, carried from the dev machine:
#   .devbundle/  (scripts/device_bundle.sh build exl3)   .peer/  (exllamav3 + pydantic/marisa wheels)
# Usage: bash bench/peers/run_compat_on_device.sh OUT_DIR
set -euo pipefail
out="$1"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .peer/*.whl
export PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
exl3=$PWD/.devbundle/bin/exl3

# 1. A small model, every linear checked against exllamav3's reconstruct.
$exl3 sample-hf /tmp/hf-small --arch qwen3-moe --seed 7
$exl3 quantize /tmp/hf-small /tmp/q-small --bits 3.5 --codebook mcg --device cuda --json > "$out/quantize_small.json"
$exl3 inspect /tmp/q-small > "$out/inspect_small.txt"

# 2. A larger model for conversion speed and peak memory (streaming: peak RSS << model size).
$exl3 sample-hf /tmp/hf-large --arch qwen3-moe --seed 8 --hidden 2048 --layers 4 --experts 16 --moe-intermediate 1536
du -sb /tmp/hf-large > "$out/hf_large_size.txt"
$exl3 quantize /tmp/hf-large /tmp/q-large --bits 4 --device cuda --json > "$out/quantize_large.json"

# 3. exllamav3: W_hat bit-identity and encoder NMSE/speed on the same tiles (JIT-builds its extension).
python3 bench/peers/exllamav3_compat.py --exl3 "$exl3" --model /tmp/q-small --tiles 4096 --cpu-tiles 32 \
  --bits 2,3,4,5,6 --out "$out/exllamav3_compat.json"
