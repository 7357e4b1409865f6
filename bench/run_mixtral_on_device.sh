#!/usr/bin/env bash
# On the GPU machine: a Mixtral EXL3 checkpoint (block_sparse_moe experts named w1/w3/w2, made by
# `exl3 quantize` from a tiny random MixtralForCausalLM: hidden 128, head_dim 64, 4 experts, top 2)
# carried in .devmx/, run by the CUDA engine against the CPU engine over the same ids, then the
# bundle's GPU tests. Usage: bash bench/run_mixtral_on_device.sh OUT
set -uo pipefail
out="$1"
mkdir -p "$out"
source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
ids=5,17,99,3,250,8,41,77,12,200,31,64,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21
for d in cpu cuda; do
  timeout 60 "$bin/exl3" logits .devmx --tokens $ids --device $d --out "$out/$d.safetensors" --json \
    > "$out/$d.json" 2> "$out/$d.err"
  echo "logits $d rc=$?" | tee -a "$out/summary.txt"
done
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import sys, torch
from safetensors.torch import load_file
a = load_file(sys.argv[1] + "/cpu.safetensors")["logits"].double()
b = load_file(sys.argv[1] + "/cuda.safetensors")["logits"].double()
print("mixtral CUDA vs CPU logits rel-L2 %.3e, argmax equal at %d of %d positions"
      % (((b - a).norm() / a.norm()).item(), (a.argmax(-1) == b.argmax(-1)).sum().item(), a.shape[0]))
PY
gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
