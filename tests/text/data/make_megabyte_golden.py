#!/usr/bin/env python3
"""Writes golden_megabyte.json for tests/text/tokenizer_megabyte_test.cpp: 1,000,000+ bytes of
mixed text per tokenizer, encoded by the reference `tokenizers` library, kept as a SHA-256 of the
ids (and of every 16384-id prefix, so a mismatch is located without committing the ids).

The text is generated, not stored: a splitmix64 stream picks pieces (English words, some in
ASCII upper case or capitalised, numbers of 1 to 10 digits, whitespace runs, punctuation and contractions, characters of
Latin-1, Greek, Cyrillic, Hiragana, CJK, math symbols and emoji, fragments of code). The C++ test
builds the same bytes with the same rules (MixedText there); any change here must be made there.

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    /tmp/tokvenv/bin/python tests/text/data/make_megabyte_golden.py [CONFORMANCE_DIR]
"""
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
EXPECTED_VERSION = "0.23.3"
MASK = (1 << 64) - 1
TARGET_BYTES = 1_000_000
PREFIX_STEP = 16384

WORDS = ["the", "harbour", "town", "woke", "slowly", "while", "fishing", "boats", "returned",
         "with", "their", "catch", "and", "children", "ran", "along", "quay", "bakery", "opened",
         "early", "river", "winter", "summer", "people", "story", "old", "new", "light", "road",
         "market", "bread", "school", "north", "south", "quickly", "because", "although", "never",
         "quantization", "transformer", "kernel", "tensor", "gradient", "Hello", "World", "API",
         "JSON", "naïve", "café", "Straße", "don't", "it's", "we'll", "they're", "I'm", "you've"]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "   "]
PUNCT = [".", ",", "!", "?", "'s", "'ll", "...", "--", "(", ")", "\"", ":", ";", "/", "'",
         "-", "&", "%", "$", "#", "@"]
CODE = ["def ", "return ", "{", "}", "==", "->", "i++", "0x1F", "std::", "<div>", "</div>",
        "if (x) {", "    ", "//", "#include", "[]", "a_b", "__init__", "=>", "!="]
BLOCKS = [(0xC0, 0xFF), (0x391, 0x3C9), (0x410, 0x44F), (0x3041, 0x3096), (0x4E00, 0x4FFF),
          (0x2200, 0x22FF), (0x1F600, 0x1F64F)]


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def ascii_upper(w):
    """Upper case of ASCII letters only (the C++ side needs no Unicode case tables)."""
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in w)


def mixed_text(seed=20261205):
    rng = SplitMix64(seed)
    parts, size = [], 0
    while size < TARGET_BYTES:
        r = rng.next() % 100
        if r < 40:
            w = WORDS[rng.next() % len(WORDS)]
            case = rng.next() % 8
            piece = ascii_upper(w) if case == 0 else (ascii_upper(w[0]) + w[1:] if case < 3 else w)
        elif r < 65:
            piece = SPACES[rng.next() % len(SPACES)]
        elif r < 75:
            piece = PUNCT[rng.next() % len(PUNCT)]
        elif r < 83:
            digits = rng.next() % 10 + 1
            piece = "".join(str(rng.next() % 10) for _ in range(digits))
        elif r < 93:
            lo, hi = BLOCKS[rng.next() % len(BLOCKS)]
            piece = chr(lo + rng.next() % (hi - lo + 1))
        else:
            piece = CODE[rng.next() % len(CODE)]
        parts.append(piece)
        size += len(piece.encode("utf-8"))
    return "".join(parts)


def digest(ids):
    return hashlib.sha256(b"".join(struct.pack("<i", i) for i in ids)).hexdigest()


def main():
    if tokenizers.__version__ != EXPECTED_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__}; the goldens are made with {EXPECTED_VERSION}")
    conf = Path(sys.argv[1] if len(sys.argv) > 1 else
                os.environ.get("EXL3_CONFORMANCE_DIR", HERE.parents[3] / "shared" / "conformance"))
    sources = {"conformance": conf / "models" / "tiny-qwen3moe-exl3" / "tokenizer.json"}
    for style in ("qwen2_style", "llama3_style", "o200k_style", "digits_style",
                  "digits_grouped_style", "sp_llama_style", "sp_meta_style", "sp_gemma_style",
                  "sp_split_style"):
        sources[style] = HERE / style / "tokenizer.json"
    text = mixed_text()
    data = text.encode("utf-8")
    out = {"generator": "make_megabyte_golden.py", "tokenizers": tokenizers.__version__,
           "text_bytes": len(data), "text_sha256": hashlib.sha256(data).hexdigest(),
           "prefix_step": PREFIX_STEP, "tokenizers_ids": {}}
    for name, path in sources.items():
        ids = Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids
        out["tokenizers_ids"][name] = {
            "count": len(ids), "sha256": digest(ids),
            "prefixes": [digest(ids[:n]) for n in range(PREFIX_STEP, len(ids), PREFIX_STEP)]}
        print(f"{name}: {len(ids)} ids", file=sys.stderr)
    (HERE / "golden_megabyte.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
