#!/usr/bin/env python3
"""Writes the tokenizer golden data for tests/text/tokenizer_test.cpp.

Ground truth comes from the reference implementation, Hugging Face `tokenizers` (the Rust library
behind every `tokenizer.json`). The committed files were produced with:

    tokenizers==0.23.3   (Python 3.11, `pip install tokenizers==0.23.3`)

Usage (from the repository root):

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    /tmp/tokvenv/bin/python tests/text/data/make_tokenizer_golden.py [CONFORMANCE_DIR]

CONFORMANCE_DIR defaults to ../shared/conformance (or $EXL3_CONFORMANCE_DIR). It writes, under
tests/text/data/:

  qwen2_style/   tokenizer.json + tokenizer_config.json: a byte-level BPE trained here with the
                 Qwen2 pre-tokenizer (Split on the Qwen2 regex, Isolated, then ByteLevel without
                 regex), the NFC normalizer, ChatML special tokens, and non-special added tokens
                 that exercise lstrip/rstrip, single_word and normalized matching. Merges are
                 stored in the ["a", "b"] pair form. ChatML chat_template.
  llama3_style/  the same corpus with the Llama-3 regex (\\p{N}{1,3}), no normalizer,
                 ignore_merges=true (plus one whole-word vocab entry that only ignore_merges can
                 produce), a TemplateProcessing post-processor that prepends <|begin_of_text|>, and
                 merges in the legacy "a b" string form. Llama-3 chat_template.
  o200k_style/   the same corpus with the o200k pattern (gpt-oss and GPT-4o: cased words taking
                 their contraction case-insensitively, \\p{N}{1,3}, punctuation runs keeping
                 trailing newlines and slashes), no normalizer, gpt-oss's special tokens.
  golden_regex.json: how the reference's Split(Regex, Isolated) cuts tricky strings for the
                 Qwen2, Llama-3, GPT-2 and o200k patterns and for constructs whose meaning differs between
                 Oniguruma (what the reference compiles patterns with) and PCRE2 (\\s, \\w, \\b, \\h, ^, $,
                 (?m:...), empty matches).
  golden_conformance.json, golden_qwen2_style.json, golden_llama3_style.json,
  golden_o200k_style.json:
                 for each test string: ids with and without special tokens, and the reference
                 decode of them (whole, skip_special_tokens, and the first half of the ids, which
                 cuts multi-byte characters so invalid-UTF-8 replacement is covered).

The conformance tokenizer (models/tiny-qwen3moe-exl3/tokenizer.json: GPT-2 style ByteLevel with
use_regex=true) is read from the conformance folder and not copied.
"""
import json
import os
import sys
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
EXPECTED_VERSION = "0.23.3"

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHATML_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

# Training text: prose, code, numbers and a little of several scripts, so the merges cover
# multi-byte characters too.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a test, isn't it? They'll see what we've done.",
    "Language models read text as tokens: pieces of words chosen by byte pair encoding.",
    "In 2024 the model processed 1234567 tokens at 3.14 tokens per millisecond on 8 GPUs.",
    "def tokenize(text):\n    return [token for token in text.split() if token]\n",
    "for (int i = 0; i < n; ++i) { sum += values[i] * weights[i]; }\n",
    "    if x >= 10:\n        print(f\"value: {x:08d}\")\n    else:\n        pass\n",
    "The weather today is sunny with a chance of rain in the afternoon and evening.",
    "Café, naïve, résumé, façade, jalapeño, Zürich, São Paulo, Ångström.",
    "你好，世界！这是一个测试。日本語のテキストです。한국어 텍스트입니다.",
    "Привет, мир! Γειά σου κόσμε! مرحبا بالعالم",
    "Emoji: 😀 😃 👍 🎉 and symbols like © ® ™ € £ ¥ → ← ≤ ≥.",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)\n",
    "<html><body><p>Hello, world!</p></body></html>",
    "Tokens, tokenizers and tokenization: the tokenizer splits the text before merging.",
]

TEST_STRINGS = [
    "",
    "Hello world",
    "Hello, world! How's it going? I'm fine, they'll see; we've done it, you'd know. IT'S LOUD, DON'T 'LL",
    "def foo(x):\n    return x ** 2  # square\n\tif x>=10: print(f\"{x:08d}\")\n",
    "a    b\t\t c  \n\n\n  d   \r\n e \u00a0f\u3000g   ",
    " ",
    "   ",
    "\n",
    " \n \n\n  x",
    "1234567890 3.14159 2024-01-01 0xDEADBEEF 12345678901234567890",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4",
    "\U0001F600 \U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EF\U0001F1F5 emoji\U0001F600text",
    "cafe\u0301 na\u0308ive \u00c5 vs A\u030a, e\u0301\u0301, \ufb01 ligature, \uff21 fullwidth, \u1100\u1161\u11a8",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 "
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "a\x00b\x01c\x7f d\u200be\u2028f\u0085g",
    "supercalifragilisticexpialidocious " + "a" * 300 + " " + "ab" * 50,
    "The quick brown fox jumps over the lazy dog. The quick brown fox!",
    "x <tool>  y  </tool> z",
    "hello<tool>  world",
    "a [WORD] b a[WORD]b [WORD]",
    "I like cafe\u0301 and caf\u00e9 and cafe",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_start|>x<|im_end|> <|im_sta <|endoftext|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<|bos|>hello<|eos|> <|pad|><|pad|>",
    "hello zzyzx zzyzxzzyzx",
]


GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

REGEX_PATTERNS = [QWEN2_PATTERN, LLAMA3_PATTERN, GPT2_PATTERN,
                  r"\w+", r"\W+", r"[\w']+", r"[^\s\w]+", r"\s+", r"\S+", r"\b", r"\B", r"\d+", r"\h+",
                  r"a$", r"^b", r"(?m:a.b)", r"a.b", r"(?i:ab)", r"\p{Lu}\p{Ll}+", r"\u00e9|\x{4E00}", r"x*", r"\R",
                  r"[]a]+", r"[^]a]+", r"[[:alpha:]]+", r"[[:alnum:]_]+", r"[[:word:]]+", r"[^[:space:]]+", r"[\d]+",
                  r"[\h]+", r"\W+|[\s]", O200K_PATTERN]
REGEX_TEXTS = [
    "Hello, World! It's 2024; we'LL see.\n\n  x\r\ny\tz  ",
    "a\u180eb\u0085c\u200bd\u2028e\u00a0f\u3000g\u000bh\u000ci",
    "e\u0301x \u00b23 \u2167 \u203f_ a\u200db \u0663\u0661 \u4e00\u00e9",
    "\u0903\u20dd\u3007\u00aa\u02b0\u2160\u24b6\u0345 \u200c\u24b6b \u00b2\u00b3x",
    "a\nab a\nb b a\rb axb\n",
    "xxAbc  ABab aB 0x1F deadBEEF g",
    "]]a]b^c",
]


def train(pattern, normalizer, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials])
    tok.train_from_iterator(CORPUS * 3, trainer)
    return tok


def make_qwen2_style():
    tok = train(QWEN2_PATTERN, normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 700)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([
        AddedToken("<think>", special=False, normalized=False),
        AddedToken("</think>", special=False, normalized=False),
        AddedToken("<tool>", special=False, normalized=False, lstrip=True, rstrip=True),
        AddedToken("</tool>", special=False, normalized=False, lstrip=True),
        AddedToken("[WORD]", special=False, normalized=False, single_word=True),
        AddedToken("caf\u00e9", special=False, normalized=True),
    ])
    cfg = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": CHATML_TEMPLATE,
    }
    return tok, cfg


def make_llama3_style():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = train(LLAMA3_PATTERN, None, specials, 600)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    j = json.loads(tok.to_str())
    model = j["model"]
    model["ignore_merges"] = True
    # A whole-word vocab entry with no merge path: only ignore_merges yields it as one token.
    model["vocab"]["\u0120zzyzx"] = len(model["vocab"])
    # Legacy "a b" merge strings.
    model["merges"] = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tok = Tokenizer.from_str(json.dumps(j))
    cfg = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"__type": "AddedToken", "content": "<|eot_id|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": LLAMA3_TEMPLATE,
    }
    return tok, cfg


def make_o200k_style():
    specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>",
                "<|channel|>"]
    tok = train(O200K_PATTERN, None, specials, 700)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    cfg = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, cfg


def golden(tok, name):
    cases = []
    for text in TEST_STRINGS:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": plain,
            "decoded": tok.decode(plain, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "decoded_half": tok.decode(plain[: len(plain) // 2], skip_special_tokens=False),
        })
    return {"generator": "tests/text/data/make_tokenizer_golden.py", "tokenizers_version": tokenizers.__version__,
            "tokenizer": name, "cases": cases}


def regex_golden():
    cases = []
    for p in REGEX_PATTERNS:
        split = pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
        for t in REGEX_TEXTS:
            cases.append({"pattern": p, "text": t, "pieces": [piece for piece, _ in split.pre_tokenize_str(t)]})
    return {"generator": "tests/text/data/make_tokenizer_golden.py", "tokenizers_version": tokenizers.__version__,
            "cases": cases}


def write_json(path, obj):
    """ASCII JSON; a golden file's cases one per line (small, and diffs show which case changed)."""
    if "cases" in obj:
        head = {k: v for k, v in obj.items() if k != "cases"}
        lines = [json.dumps(head, ensure_ascii=True)[:-1] + ', "cases": [']
        lines += [" " + json.dumps(c, ensure_ascii=True) + ("," if i + 1 < len(obj["cases"]) else "")
                  for i, c in enumerate(obj["cases"])]
        text = "\n".join(lines) + "\n]}\n"
    else:
        text = json.dumps(obj, ensure_ascii=True, indent=1) + "\n"
    path.write_text(text, encoding="ascii")


def main():
    if tokenizers.__version__ != EXPECTED_VERSION:
        print(f"warning: tokenizers {tokenizers.__version__}, the committed data used {EXPECTED_VERSION}", file=sys.stderr)
    conf = Path(sys.argv[1] if len(sys.argv) > 1 else
                os.environ.get("EXL3_CONFORMANCE_DIR") or HERE.parents[2] / ".." / "shared" / "conformance")
    conf_tok = Tokenizer.from_file(str(conf / "models" / "tiny-qwen3moe-exl3" / "tokenizer.json"))
    write_json(HERE / "golden_conformance.json", golden(conf_tok, "conformance:models/tiny-qwen3moe-exl3"))
    write_json(HERE / "golden_regex.json", regex_golden())

    for name, make in (("qwen2_style", make_qwen2_style), ("llama3_style", make_llama3_style),
                       ("o200k_style", make_o200k_style)):
        tok, cfg = make()
        out = HERE / name
        out.mkdir(exist_ok=True)
        (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
        write_json(out / "tokenizer_config.json", cfg)
        # Reload from the written file so the golden is what a loader of that file must produce.
        write_json(HERE / f"golden_{name}.json", golden(Tokenizer.from_file(str(out / "tokenizer.json")), name))


if __name__ == "__main__":
    main()
