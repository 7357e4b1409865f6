"""Writes the SentencePiece-style BPE test data: two tokenizers trained here with Hugging Face
`tokenizers` on the repository README, shaped like the tokenizer.json files of Llama-2, Mistral
and Mixtral (a BPE over characters with byte_fallback: characters outside the vocabulary become
<0xXX> byte tokens) and the golden ids and decodes of the reference for them:

  sp_llama_style/  normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")], no pre-tokenizer,
                   decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0)]
                   (Llama-2, Mistral 7B v0.1, Mixtral 8x7B)
  sp_meta_style/   no normalizer, pre-tokenizer Metaspace("▁", prepend_scheme first, split
                   false), decoder Sequence[Metaspace, ByteFallback, Fuse] (Mistral v0.3 and later)
  sp_split_style/  Metaspace with prepend_scheme always and split true (words cut at "▁")

The 256 byte tokens are plain vocabulary entries (as in those models); <unk>, <s>, </s> are special
added tokens; a TemplateProcessing post-processor prepends <s>.

    pip install --target /tmp/tokpy tokenizers==0.23.3
    PYTHONPATH=/tmp/tokpy python3 tests/text/data/make_sentencepiece_golden.py
"""
import json
import pathlib

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[2]
TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "  two  spaces  ",
    "trailing space ",
    "tab\there and\nnew lines\n\n",
    "ünïcödé 漢字 🙂 and ✓",
    "<s>after a special token",
    "before</s>after",
    "a<s>b</s>c",
    "The quick brown fox jumps over the lazy dog.",
    "exl3 quantizes, loads and runs EXL3 trellis-quantized LLMs",
    "x = [1, 2, 3] # comment",
    "émoji: 😀😃😄 end",
    "CamelCaseWord and snake_case_word",
    "▁already has the meta symbol",
    "numbers 12345 and 3.14159",
    "Grüße aus Köln, naïve café",
    "日本語のテキストです。",
    "   ",
    "a",
    "\u00a0non-breaking\u00a0space",
    "mixed\r\nline endings",
]


def train(normalizer, pre_tokenizer, decoder):
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizer
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoder
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  show_progress=False)
    lines = (ROOT / "README.md").read_text().split("\n")
    tk.train_from_iterator(lines, trainer)
    j = json.loads(tk.to_str())
    # The byte tokens are ordinary vocabulary entries in the models this mimics, not added tokens.
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return j


STYLES = {
    "sp_llama_style": (
        normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None,
        decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                           decoders.Strip(" ", 1, 0)])),
    "sp_meta_style": (
        None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
        decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                           decoders.ByteFallback(), decoders.Fuse()])),
    "sp_split_style": (
        None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True),
                           decoders.ByteFallback(), decoders.Fuse()])),
}

def write_golden(name, tokenizer_json, bos, eos, texts, generator):
    """Writes HERE/name/{tokenizer.json, tokenizer_config.json} and HERE/golden_<name>.json: the
    library's ids (with and without special tokens) and decodes of each text."""
    out = HERE / name
    out.mkdir(exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "eos_token": eos}))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": plain,
                      "decoded": tok.decode(plain, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
                      "decoded_half": tok.decode(plain[: len(plain) // 2], skip_special_tokens=False)})
    golden = {"generator": generator,
              "tokenizers_version": tokenizers.__version__, "tokenizer": name, "cases": cases}
    (HERE / f"golden_{name}.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print(name, [len(c["ids"]) for c in cases])


def main():
    for name, (norm, pre, dec) in STYLES.items():
        write_golden(name, train(norm, pre, dec), "<s>", "</s>", TEXTS,
                     "tests/text/data/make_sentencepiece_golden.py")


if __name__ == "__main__":
    main()
