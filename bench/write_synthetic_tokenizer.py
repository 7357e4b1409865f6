#!/usr/bin/env python3
"""Writes a tokenizer beside a synthetic checkpoint (which has none), so the server and its
benchmark can run on it: a byte-level BPE vocabulary of the model's size (3 special tokens, the
256 bytes, then plain filler tokens), which decodes every id the model can produce.
Usage: python3 bench/write_synthetic_tokenizer.py MODEL_DIR"""
import json, os, sys
d = sys.argv[1]
vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
def byte_char(b):  # GPT-2's byte-to-unicode alphabet
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in keep:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(keep)).index(b))
specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
v = {s: i for i, s in enumerate(specials)}
for b in range(256):
    v[byte_char(b)] = 3 + b
for i in range(259, vocab):
    v[f"w{i}"] = i
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": False, "special": True}
                        for i, s in enumerate(specials)],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True},
       "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None,
                 "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": v, "merges": []}}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
           "tokenizer_class": "PreTrainedTokenizerFast"},
          open(os.path.join(d, "tokenizer_config.json"), "w"))
