"""Writes the Gemma-style SentencePiece BPE test data: a tokenizer trained here with Hugging Face
`tokenizers` on the repository README, shaped like Gemma's tokenizer.json (a BPE over characters
with byte_fallback, as make_sentencepiece_golden.py's, but without the dummy prefix), and the
golden ids and decodes of the reference for it:

  sp_gemma_style/  normalizer Replace(" " -> "▁") alone (no Prepend: Gemma's SentencePiece model
                   adds no leading "▁"), no pre-tokenizer, decoder Sequence[Replace("▁" -> " "),
                   ByteFallback, Fuse] (nothing to strip); Gemma's special ids <pad> 0, <eos> 1,
                   <bos> 2, <unk> 3, and the chat turn markers <start_of_turn> / <end_of_turn> as
                   special added tokens; a TemplateProcessing post-processor prepends <bos>

The 256 byte tokens are plain vocabulary entries. Google's own tokenizer is not used (nothing is
downloaded); this reproduces its pipeline, not its vocabulary.

    pip install --target /tmp/tokpy tokenizers==0.23.3
    PYTHONPATH=/tmp/tokpy python3 tests/text/data/make_gemma_golden.py
"""
import json
import pathlib

from tokenizers import Tokenizer, decoders, models, normalizers, trainers

from make_sentencepiece_golden import write_golden

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[2]
NAME = "sp_gemma_style"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "  two  spaces  ",
    "trailing space ",
    "tab\there and\nnew lines\n\n",
    "ünïcödé 漢字 🙂 and ✓",
    "<bos>after a special token",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "a<eos>b<pad>c",
    "The quick brown fox jumps over the lazy dog.",
    "exl3 quantizes, loads and runs EXL3 trellis-quantized LLMs",
    "x = [1, 2, 3] # comment",
    "émoji: 😀😃😄 end",
    "▁already has the meta symbol",
    "numbers 12345 and 3.14159",
    "日本語のテキストです。",
    "   ",
    "a",
    "\u00a0non-breaking\u00a0space",
    "mixed\r\nline endings",
]


def train():
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizers.Replace(" ", "▁")
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS + byte_tokens,
                                  show_progress=False)
    lines = (ROOT / "README.md").read_text().split("\n")
    tk.train_from_iterator(lines, trainer)
    j = json.loads(tk.to_str())
    # The byte tokens are ordinary vocabulary entries in Gemma, not added tokens.
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in SPECIALS]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2],
                                                        "tokens": ["<bos>"]}}}
    return j


def main():
    write_golden(NAME, train(), "<bos>", "<eos>", TEXTS, "tests/text/data/make_gemma_golden.py")


if __name__ == "__main__":
    main()
