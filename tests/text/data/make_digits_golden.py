"""Writes the Digits pre-tokenizer test data: two tokenizers (SmolLM2's pre-tokenizer shape,
Sequence[Digits, ByteLevel(use_regex)], with individual_digits true and false) made from the
qwen2_style vocabulary and merges, and the golden ids of Hugging Face `tokenizers` for them.

    pip install --target /tmp/tokpy tokenizers==0.23.3
    PYTHONPATH=/tmp/tokpy python3 tests/text/data/make_digits_golden.py
"""
import json
import pathlib

import tokenizers

HERE = pathlib.Path(__file__).parent
TEXTS = [
    "",
    "Call 911 now",
    "12345 apples and 67 pears",
    "pi is 3.14159, e is 2.71828",
    "2024-12-01T16:24:02Z",
    "x2y3z4 a1b22c333",
    "\u0663\u0664\u0665 and \u00bd and \u216b and \u00b2",  # Arabic-Indic digits, a fraction, a Roman numeral, a superscript
    "  007  ",
    "line1\nline22\n\n333",
    "1",
    "11",
    "111",
    "1111 2222 12121",
    "call me at 555-0199",
    "room 101, floor 11",
    "v1.2.11 released",
    "\u0661\u0661 vs 11",
    "0x1f2e",
    "3\u00d74=12",
    "99 bottles",
    "\uff11\uff12 fullwidth",
    "a 1 b 22 c 333 d 4444",
]

base = json.loads((HERE / "qwen2_style" / "tokenizer.json").read_text())
# Two digit merges ("11", "22"), so grouping digits or not changes the ids: they take over the
# ids of the model's two last-learned tokens (whose merges, and merges using them, go), so the
# added tokens keep their ids right after the model vocabulary.
model = base["model"]
vocab = model["vocab"]
as_pair = lambda m: tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
last_two = sorted(vocab.items(), key=lambda kv: kv[1])[-2:]
gone = {tok for tok, _ in last_two}
model["merges"] = [m for m in model["merges"]
                   if "".join(as_pair(m)) not in gone and not set(as_pair(m)) & gone]
for (old_tok, old_id), new_tok in zip(last_two, ("11", "22")):
    del vocab[old_tok]
    vocab[new_tok] = old_id
    pair = (new_tok[0], new_tok[1])
    model["merges"].insert(0, list(pair) if model["merges"] and isinstance(model["merges"][0], list) else " ".join(pair))

for name, individual in (("digits_style", True), ("digits_grouped_style", False)):
    t = dict(base)
    t["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": individual},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    out = HERE / name
    out.mkdir(exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(t, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text((HERE / "qwen2_style" / "tokenizer_config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
                      "decoded_half": tok.decode(ids[: len(ids) // 2], skip_special_tokens=False)})
    golden = {"generator": "tests/text/data/make_digits_golden.py", "tokenizers_version": tokenizers.__version__,
              "tokenizer": name, "cases": cases}
    (HERE / f"golden_{name}.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print(name, [len(c["ids"]) for c in cases])
